package scenario

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Reference benchmark 4 and upstream baseline A' (own connections,
// 14×20,000): the Python clients' published throughput test. Each
// goroutine has a connection of its own, so nothing is shared between
// publishers inside the client; what a read mode costs here is its
// per-connection overhead on the publish path (legacy's transport lock,
// the drainer's background reader) while the broker is the bottleneck.
// Because the broker is the bottleneck, what the client spends per
// message (CPU, system calls) is the figure issue #18 sets goals for here:
// it is measured over the publishing alone, not the wait for the broker
// to count the messages, which polls over a connection of its own.
func init() {
	Register(&Scenario{
		Name:  "client-throughput",
		Title: "9. Client throughput: 14 goroutines, a connection each",
		About: "14 goroutines, each with its own connection and channel, publish 20,000 copies of the " +
			"43-byte seed message (application/json, utf-8, no confirms) to their own queue. Throughput " +
			"is 280,000 messages over the time until QueueDeclarePassive reports them all enqueued; the " +
			"publish-return rate is reported beside it. From the start of the publishing until the " +
			"last publish returned: the process's CPU time (getrusage, every thread) per 100,000 " +
			"messages, read and write syscalls per message from /proc/self/io (syscr + syscw; futex " +
			"and epoll_wait are not counted there), voluntary context switches per message " +
			"(getrusage nvcsw), and a CPU profile (runtime/pprof) saved beside the results.",
		Timeout: time.Minute,
		Run:     runClientThroughput,
		Report: Report{
			Columns: []Column{
				{Label: "enqueued msg/s", Metric: "enqueued_msg_s"},
				{Label: "publish-return msg/s", Metric: "publish_msg_s"},
				{Label: "s until enqueued", Metric: "enqueued_s", Digits: 2},
				{Label: "slowest goroutine s", Metric: "slowest_s", Digits: 2},
				{Label: "fastest goroutine s", Metric: "fastest_s", Digits: 2},
				{Label: "CPU-s / 100k", Metric: "cpu_s_per_100k", Digits: 3},
				{Label: "syscalls / msg", Metric: "syscalls_per_msg", Digits: 3},
				{Label: "vol. ctx switches / msg", Metric: "nvcsw_per_msg", Digits: 3},
			},
			Ratios: []Ratio{
				{Label: "drainer / pristine enqueued msg/s", Metric: "enqueued_msg_s", Num: "drainer", Den: "pristine"},
				{Label: "legacy / pristine enqueued msg/s", Metric: "enqueued_msg_s", Num: "legacy", Den: "pristine"},
				{Label: "drainer / upstream enqueued msg/s", Metric: "enqueued_msg_s", Num: "drainer", Den: "upstream"},
				{Label: "pristine / drainer CPU-s per 100k", Metric: "cpu_s_per_100k", Num: "pristine", Den: "drainer"},
			},
			// Issue #18's goals for the 14-publisher case.
			Targets: []Target{
				AtMost("drainer syscalls per message at most 0.3", "drainer", "syscalls_per_msg", 0.3, "syscalls"),
				AtMost("drainer CPU-s per 100k messages at most 0.3", "drainer", "cpu_s_per_100k", 0.3, "CPU-s"),
			},
			Reference: "Upstream amqp091-go v1.16.0 on this machine (baseline A', 14×20,000, own connections): " +
				"107k msg/s enqueued (105k–121k); the same test with Debian's py-amqp 5.1.1 16.4k and pika 1.2.0 " +
				"12.7k msg/s (client-CPU-bound). Published on a 12-core laptop against a two-node cluster: " +
				"py-amqp ~18,000, librabbitmq (C) ~102,000, pika ~11,000 msg/s.",
		},
	})
}

// clientPublishers is the reference's thread count.
const clientPublishers = 14

// runClientThroughput measures the one case: 14 connections in the mode
// under test, each publishing a fixed count to its own queue.
func runClientThroughput(ctx context.Context, env *Env, _ string) (*Result, error) {
	perGoroutine := 20_000
	if env.Quick {
		perGoroutine = 1_000
	}
	queues, err := declareQueues(env, clientPublishers)
	if err != nil {
		return nil, err
	}
	chans := make([]*amqp.Channel, clientPublishers)
	for i := range chans {
		conn, err := env.Dial(dialDefaults)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		if chans[i], err = conn.Channel(); err != nil {
			return nil, fmt.Errorf("channel %d: %w", i, err)
		}
	}

	res := NewResult()
	meter, err := startCost(env, res)
	if err != nil {
		return nil, err
	}
	defer meter.end()
	run := runPublishers(ctx, chans, queues, seedPublishing(), false,
		func(sent int, _ time.Time) bool { return sent < perGoroutine },
		func(time.Time) {})
	if run.err != nil {
		return nil, run.err
	}
	sent := 0
	for _, p := range run.pubs {
		sent += p.n
	}
	if _, err := meter.stop(res, sent); err != nil {
		return nil, err
	}
	if err := run.report(ctx, env, res); err != nil {
		return res, err
	}
	// With fixed counts, the spread between connections shows as time:
	// the baseline saw the broker serve connections unevenly.
	slowest, fastest := time.Duration(0), time.Duration(1<<62)
	for _, p := range run.pubs {
		d := p.end.Sub(run.start)
		slowest, fastest = max(slowest, d), min(fastest, d)
	}
	res.Set("slowest_s", slowest.Seconds())
	res.Set("fastest_s", fastest.Seconds())
	return res, nil
}
