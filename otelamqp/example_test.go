package otelamqp_test

import (
	"context"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp"
)

// Publish and consume over instrumented drainer-mode connections. The
// example has no output to check, so `go test` compiles it without
// running it: it needs a broker.
func Example() {
	ctx := context.Background()
	tp := sdktrace.NewTracerProvider() // add an exporter: sdktrace.WithBatcher(exp)
	defer tp.Shutdown(ctx)
	mp := sdkmetric.NewMeterProvider() // add a reader: sdkmetric.WithReader(r)
	defer mp.Shutdown(ctx)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	opts := []otelamqp.Option{otelamqp.WithTracerProvider(tp), otelamqp.WithMeterProvider(mp)}

	conn, err := amqp.DialConfig("amqp://guest:guest@127.0.0.1:5672/", amqp.Config{
		ReadPath: amqp.Drainer(amqp.DrainerOptions{Observer: otelamqp.NewObserver(opts...)}),
	})
	if err != nil {
		log.Print(err)
		return
	}
	defer conn.Close()
	unregister, err := otelamqp.RegisterStats(conn, append(opts, otelamqp.WithAttributes(attribute.String("connection", "example")))...)
	if err != nil {
		log.Print(err)
		return
	}
	defer unregister()

	ch, err := conn.Channel()
	if err != nil {
		log.Print(err)
		return
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		log.Print(err)
		return
	}
	deliveries, err := ch.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		log.Print(err)
		return
	}
	// PublishWithContext is the observed publish: its span is a child of
	// ctx's, and its context travels in the message headers.
	if err := ch.PublishWithContext(ctx, "", q.Name, false, false, amqp.Publishing{Body: []byte("hello")}); err != nil {
		log.Print(err)
		return
	}
	d := <-deliveries
	// The handling's span: child of the producer's span, linked to it.
	_, span := otelamqp.StartProcessSpan(ctx, &d, opts...)
	_ = d.Ack(false)
	span.End()
}

// A ConsumeFunc handler gets its process span from the Observer; spans
// the handler starts itself can hang off the producer's with
// ContextFromDelivery.
func ExampleContextFromDelivery() {
	var ch *amqp.Channel // an open channel of an observed connection
	ctx := context.Background()
	tracer := otel.Tracer("example")
	if ch == nil {
		return
	}
	_ = ch.ConsumeFunc(ctx, "orders", amqp.ConsumeFuncOptions{}, func(d *amqp.Delivery) error {
		_, span := tracer.Start(otelamqp.ContextFromDelivery(ctx, d), "store order")
		defer span.End()
		return d.Ack(false)
	})
}
