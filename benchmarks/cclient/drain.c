/*
 * The drain benchmark's C reference (issue #18): the same drain as
 * benchmarks/scenario/drain.go, by the C client librabbitmq (rabbitmq-c),
 * which reads and decodes on the caller's thread. The bench runner builds it
 * when the librabbitmq headers are installed (Debian: librabbitmq-dev) and
 * runs it as the c-client variant; the scenario fills the queue first.
 *
 *   drain URL QUEUE N PREFETCH ACK_EVERY
 *
 * It prints one line, measured from just before basic.consume to the last
 * delivery's ack, as the Go variants are:
 *
 *   received wall_ns cpu_ns nvcsw
 *
 * cpu_ns is getrusage user + system and nvcsw its voluntary context
 * switches. System calls are not counted: librabbitmq uses recv and send,
 * which /proc/self/io's syscr and syscw (the Go variants' count of read
 * and write) do not see.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long cpu_ns(long *nvcsw) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  *nvcsw = ru.ru_nvcsw;
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
}

static int fail(const char *what, amqp_rpc_reply_t r) {
  if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
    fprintf(stderr, "drain: %s: %s\n", what, amqp_error_string2(r.library_error));
  else
    fprintf(stderr, "drain: %s: reply type %d\n", what, (int)r.reply_type);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: drain URL QUEUE N PREFETCH ACK_EVERY\n");
    return 2;
  }
  struct amqp_connection_info info;
  char *url = strdup(argv[1]);
  if (amqp_parse_url(url, &info) != AMQP_STATUS_OK) {
    fprintf(stderr, "drain: bad URL\n");
    return 2;
  }
  /* "amqp://host/" parses to the empty vhost; the Go clients take it as "/". */
  if (!info.vhost || !*info.vhost) info.vhost = "/";
  long n = atol(argv[3]), ack_every = atol(argv[5]);
  int prefetch = atoi(argv[4]);

  amqp_connection_state_t c = amqp_new_connection();
  amqp_socket_t *s = amqp_tcp_socket_new(c);
  if (!s || amqp_socket_open(s, info.host, info.port) != AMQP_STATUS_OK) {
    fprintf(stderr, "drain: cannot connect to %s:%d\n", info.host, info.port);
    return 1;
  }
  amqp_rpc_reply_t r = amqp_login(c, info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) return fail("login", r);
  amqp_channel_open(c, 1);
  if ((r = amqp_get_rpc_reply(c)).reply_type != AMQP_RESPONSE_NORMAL) return fail("channel.open", r);
  amqp_basic_qos(c, 1, 0, prefetch, 0);
  if ((r = amqp_get_rpc_reply(c)).reply_type != AMQP_RESPONSE_NORMAL) return fail("basic.qos", r);

  long nv0, nv1;
  long long cpu0 = cpu_ns(&nv0), t0 = now_ns();
  amqp_basic_consume(c, 1, amqp_cstring_bytes(argv[2]), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  if ((r = amqp_get_rpc_reply(c)).reply_type != AMQP_RESPONSE_NORMAL) return fail("basic.consume", r);
  long got = 0;
  while (got < n) {
    amqp_envelope_t e;
    amqp_maybe_release_buffers(c);
    r = amqp_consume_message(c, &e, NULL, 0);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) return fail("consume", r);
    got++;
    if (got % ack_every == 0 || got == n) {
      if (amqp_basic_ack(c, 1, e.delivery_tag, 1) != 0) {
        fprintf(stderr, "drain: ack failed\n");
        return 1;
      }
    }
    amqp_destroy_envelope(&e);
  }
  long long t1 = now_ns(), cpu1 = cpu_ns(&nv1);
  printf("%ld %lld %lld %ld\n", got, t1 - t0, cpu1 - cpu0, nv1 - nv0);
  fflush(stdout);
  amqp_connection_close(c, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(c);
  free(url);
  return 0;
}
