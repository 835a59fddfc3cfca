package otelamqp_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp/internal/overhead"
)

// BenchmarkHooks calls the otel Observer's publish and confirm funcs as
// the read path does, without a broker: the instrumentation's own cost
// per message, apart from the network's.
func BenchmarkHooks(b *testing.B) {
	obs, release := overhead.OTel()
	defer release()
	info := amqp.PublishInfo{Channel: 1, Exchange: "amq.direct", RoutingKey: overhead.RoutingKey, BodySize: 64}
	body := make([]byte, 64)
	b.Run("publish", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			msg := amqp.Publishing{Body: body}
			ctx := obs.BeforePublish(context.Background(), info, &msg)
			info.DeliveryTag = uint64(i + 1)
			obs.Published(ctx, info, nil)
		}
	})
	b.Run("confirm", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			obs.Confirmed(amqp.ConfirmInfo{Channel: 1, DeliveryTag: uint64(i + 1), Ack: true, Latency: time.Millisecond})
		}
	})
	d := &amqp.Delivery{Exchange: "amq.direct", RoutingKey: "q", DeliveryTag: 1, Body: body}
	msg := amqp.Publishing{}
	ctx := obs.BeforePublish(context.Background(), info, &msg)
	obs.Published(ctx, info, nil)
	d.Headers = msg.Headers
	b.Run("deliver", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			obs.Delivered(d)
		}
	})
	b.Run("settle", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			obs.Settled(amqp.SettleInfo{Kind: amqp.SettleAck, Channel: 1, DeliveryTag: 1})
		}
	})
}
