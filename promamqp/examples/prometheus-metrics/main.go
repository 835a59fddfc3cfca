// Command prometheus-metrics publishes and consumes on a drainer-mode
// connection and serves the client's metrics for Prometheus at /metrics:
// the Observer's counters (publishes, confirms, deliveries, acks, RPC
// latencies) and the connection's Stats (socket bytes and frames, the
// budget, what waits for listeners and consumers).
//
//	go run ./examples/prometheus-metrics          # AMQP_URL, default the local broker
//	curl -s 127.0.0.1:2112/metrics | grep ^amqp091_
//
// It runs until interrupted. -rate sets the publishes per second; -slow
// makes the consumer sleep per message so that the budget and the
// consumer gauges have something to show.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/amqp091-drainer/amqp091-drainer/promamqp"
)

func main() {
	defURL := os.Getenv("AMQP_URL")
	if defURL == "" {
		defURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	listen := flag.String("listen", "127.0.0.1:2112", "address to serve /metrics on")
	url := flag.String("url", defURL, "broker URL (default $AMQP_URL or the local broker)")
	rate := flag.Int("rate", 100, "publishes per second")
	slow := flag.Duration("slow", 0, "how long the consumer takes per message")
	budget := flag.Int64("budget", 8<<20, "the drainer's memory budget in bytes")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *listen, *url, *rate, *slow, *budget); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, listen, url string, rate int, slow time.Duration, budget int64) error {
	metrics := promamqp.New()
	// A registry of our own rather than the default one, so the example
	// shows everything it exposes; the Go and process collectors sit
	// next to the client's metrics as they would in a service.
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	conn, err := amqp.DialConfig(url, amqp.Config{
		ReadPath: amqp.Drainer(amqp.DrainerOptions{Budget: budget, Observer: metrics.Observer()}),
	})
	if err != nil {
		return fmt.Errorf("dial %s: %w", url, err)
	}
	defer conn.Close()
	metrics.Watch("example", conn)

	// Listen before serving, so that a busy port fails the command at
	// once rather than from a goroutine.
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Printf("serving http://%s/metrics (read mode %s)", ln.Addr(), conn.ReadMode())

	// Publisher and consumer on channels of their own, so that a slow
	// consumer never holds up the publisher's channel.
	pub, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := pub.Confirm(false); err != nil {
		return err
	}
	q, err := pub.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	sub, err := conn.Channel()
	if err != nil {
		return err
	}
	deliveries, err := sub.ConsumeWithContext(ctx, q.Name, "", false, false, false, false, nil)
	if err != nil {
		return err
	}

	consumed := make(chan error, 1)
	go func() { consumed <- consume(deliveries, slow) }()
	pubErr := publish(ctx, pub, q.Name, rate)

	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	<-served
	_ = conn.Close() // closes deliveries, which ends consume
	if err := <-consumed; err != nil && pubErr == nil {
		pubErr = err
	}
	if errors.Is(pubErr, context.Canceled) {
		return nil
	}
	return pubErr
}

// publish sends rate messages a second with confirms until ctx ends. It
// does not wait for each confirm: the drainer settles them while the
// publisher goes on, and amqp091_confirm_latency_seconds shows how long
// they took.
func publish(ctx context.Context, ch *amqp.Channel, queue string, rate int) error {
	tick := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		_, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
			amqp.Publishing{ContentType: "text/plain", Body: fmt.Appendf(nil, "message %d", i)})
		if err != nil {
			return err
		}
	}
}

// consume acks every delivery until the connection closes.
func consume(deliveries <-chan amqp.Delivery, slow time.Duration) error {
	for d := range deliveries {
		if slow > 0 {
			time.Sleep(slow) // stands in for the application's work
		}
		if err := d.Ack(false); err != nil && !errors.Is(err, amqp.ErrClosed) {
			return err
		}
	}
	return nil
}
