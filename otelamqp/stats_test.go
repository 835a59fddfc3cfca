package otelamqp_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp"
)

func TestRegisterStats(t *testing.T) {
	url := brokerURL(t)
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	h := watch(obs)
	conn := dial(t, url, amqp.Drainer(amqp.DrainerOptions{Observer: obs}))
	name := attribute.String("connection", "stats-test")
	unregister, err := otelamqp.RegisterStats(conn, tel.options(otelamqp.WithAttributes(name))...)
	if err != nil {
		t.Fatalf("RegisterStats: %v", err)
	}

	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	q := declareQueue(t, ch)
	// Deliveries nobody receives: they wait in the consumer's buffer.
	if _, err := ch.Consume(q, "unread", false, true, false, false, nil); err != nil {
		t.Fatalf("consume: %v", err)
	}
	const n = 5
	for i := 0; i < n; i++ {
		if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	waitN(t, h.delivered, n, timeout, "Delivered hooks")

	rm := tel.collect(t)
	drainer := attribute.String("amqp091.read_mode", "drainer")
	if got := sum(t, rm, otelamqp.MetricBudgetLimit, name, drainer); got != 64<<20 {
		t.Errorf("%s = %d, want the default 64 MiB", otelamqp.MetricBudgetLimit, got)
	}
	if findMetric(rm, otelamqp.MetricBudgetUsed) == nil || findMetric(rm, otelamqp.MetricBudgetPaused) == nil {
		t.Errorf("budget gauges missing")
	}
	// Delivered runs before the delivery is queued, so the count may lag
	// by the last ones; it cannot exceed what was delivered.
	if got := sum(t, rm, otelamqp.MetricConsumerQueued, name); got < 0 || got > n {
		t.Errorf("%s = %d, want 0..%d", otelamqp.MetricConsumerQueued, got, n)
	}
	for _, kind := range []string{"NotifyPublish", "NotifyReturn", "NotifyFlow", "NotifyCancel", "NotifyBlocked"} {
		m := findMetric(rm, otelamqp.MetricListenerQueued)
		if m == nil {
			t.Fatalf("%s missing", otelamqp.MetricListenerQueued)
		}
		if got := sum(t, rm, otelamqp.MetricListenerQueued, attribute.String("amqp091.listener.kind", kind)); got != 0 {
			t.Errorf("%s{%s} = %d, want 0 with no listener", otelamqp.MetricListenerQueued, kind, got)
		}
	}
	if got := sum(t, rm, otelamqp.MetricConnectionBytes, attribute.String("network.io.direction", "receive")); got <= 0 {
		t.Errorf("%s{receive} = %d, want > 0", otelamqp.MetricConnectionBytes, got)
	}
	if got := sum(t, rm, otelamqp.MetricConnectionBytes, attribute.String("network.io.direction", "transmit")); got <= 0 {
		t.Errorf("%s{transmit} = %d, want > 0", otelamqp.MetricConnectionBytes, got)
	}

	if err := unregister(); err != nil {
		t.Fatalf("unregister: %v", err)
	}
	rm = tel.collect(t)
	if m := findMetric(rm, otelamqp.MetricBudgetLimit); m != nil {
		t.Errorf("%s still reported after unregister: %+v", otelamqp.MetricBudgetLimit, m.Data)
	}
}

func TestRegisterStatsNil(t *testing.T) {
	if _, err := otelamqp.RegisterStats(nil); err == nil {
		t.Fatal("RegisterStats(nil) returned no error")
	}
}

func TestReturned(t *testing.T) {
	url := brokerURL(t)
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	returned := signal(&obs.Returned, 1)
	conn := dial(t, url, amqp.Drainer(amqp.DrainerOptions{Observer: obs}))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	// A mandatory publish no queue is bound for comes back as basic.return.
	err = ch.PublishWithContext(context.Background(), "amq.direct", "otelamqp.test.nowhere", true, false, amqp.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	waitN(t, returned, 1, timeout, "Returned hook")
	rm := tel.collect(t)
	if n := sum(t, rm, otelamqp.MetricPublishReturned,
		attribute.Int("amqp091.reply_code", 312),
		attribute.String("messaging.destination.name", "amq.direct:otelamqp.test.nowhere")); n != 1 {
		t.Errorf("%s{312} = %d, want 1", otelamqp.MetricPublishReturned, n)
	}
}
