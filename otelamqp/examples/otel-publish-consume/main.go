// Command otel-publish-consume publishes a few messages over one
// drainer-mode connection and consumes them over another, both observed
// by otelamqp, and prints every span to stdout as it ends: the producer's
// "publish" spans, the "receive" spans that link to them and the
// "process" spans that are their children.
//
//	go run ./examples/otel-publish-consume
//
// The broker is AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp"
)

const messages = 3

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	exp, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	// A syncer, not a batcher: each span prints as it ends, in order.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	opts := []otelamqp.Option{
		otelamqp.WithTracerProvider(tp),
		otelamqp.WithPropagators(propagation.TraceContext{}),
	}
	rp := amqp.Drainer(amqp.DrainerOptions{Observer: otelamqp.NewObserver(opts...)})

	sub, err := amqp.DialConfig(url, amqp.Config{ReadPath: rp})
	if err != nil {
		return err
	}
	defer sub.Close()
	pub, err := amqp.DialConfig(url, amqp.Config{ReadPath: rp})
	if err != nil {
		return err
	}
	defer pub.Close()

	subCh, err := sub.Channel()
	if err != nil {
		return err
	}
	q, err := subCh.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	deliveries, err := subCh.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		return err
	}

	pubCh, err := pub.Channel()
	if err != nil {
		return err
	}
	if err := pubCh.Confirm(false); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < messages; i++ {
		dc, err := pubCh.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("example-%d", i),
			Body:      []byte(fmt.Sprintf("message %d", i)),
		})
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish %d not confirmed: %v", i, err)
		}
	}

	for i := 0; i < messages; i++ {
		select {
		case d := <-deliveries:
			_, span := otelamqp.StartProcessSpan(ctx, &d, opts...)
			fmt.Fprintf(os.Stderr, "handled %s: %s\n", d.MessageId, d.Body)
			err := d.Ack(false)
			span.End()
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
