package otelamqp_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

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
	// A password that does not expire: no expiry, rather than a 0 that
	// would read as expired in 1970.
	if m := findMetric(rm, otelamqp.MetricCredentialExpiry); m != nil {
		t.Errorf("%s reported without expiring credentials: %+v", otelamqp.MetricCredentialExpiry, m.Data)
	}

	if err := unregister(); err != nil {
		t.Fatalf("unregister: %v", err)
	}
	rm = tel.collect(t)
	if m := findMetric(rm, otelamqp.MetricBudgetLimit); m != nil {
		t.Errorf("%s still reported after unregister: %+v", otelamqp.MetricBudgetLimit, m.Data)
	}
}

// TestRegisterStatsCredentials logs in with credentials that expire 1.5 s
// later, as an OAuth 2 token would, and checks the expiry RegisterStats
// reports against Stats before and after the refresh that comes at 80% of
// that lifetime, which the Observer counts. The provider answers with the
// URL's own user and password, which the broker's default (internal)
// backend takes with update-secret.
func TestRegisterStatsCredentials(t *testing.T) {
	const lifetime = 1500 * time.Millisecond
	url := brokerURL(t)
	uri, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	provider := func(context.Context) (amqp.Authentication, error) {
		return amqp.ExpiringAuth{
			Authentication: &amqp.PlainAuth{Username: uri.Username, Password: uri.Password},
			Expires:        time.Now().Add(lifetime),
		}, nil
	}
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	refreshed := signal(&obs.Refreshed, 16) // room for the refreshes the test does not wait for
	conn, err := amqp.DialConfig(url, amqp.Config{
		ReadPath:    amqp.Drainer(amqp.DrainerOptions{Observer: obs}),
		Credentials: provider,
	})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	unregister, err := otelamqp.RegisterStats(conn, tel.options()...)
	if err != nil {
		t.Fatalf("RegisterStats: %v", err)
	}
	t.Cleanup(func() { _ = unregister() })
	drainer := attribute.String("amqp091.read_mode", "drainer")

	login := conn.Stats().Credentials
	if got, ok := floatGauge(tel.collect(t), otelamqp.MetricCredentialExpiry, drainer); !ok || got != unix(login.Expires) {
		t.Errorf("%s before the refresh = %v (reported %v), want the login's %v",
			otelamqp.MetricCredentialExpiry, got, ok, unix(login.Expires))
	}

	waitN(t, refreshed, 1, 10*lifetime, "Refreshed hook")
	// A later refresh may land during the collection: bracket it.
	before := conn.Stats().Credentials
	rm := tel.collect(t)
	after := conn.Stats().Credentials
	if n := sum(t, rm, otelamqp.MetricCredentialRefreshes); n < 1 || n > int64(after.Refreshes) {
		t.Errorf("%s = %d, want 1..%d", otelamqp.MetricCredentialRefreshes, n, after.Refreshes)
	}
	if n := sum(t, rm, otelamqp.MetricCredentialRefreshes, attribute.String("error.type", "refused")); n != 0 {
		t.Errorf("%s{error.type=refused} = %d, want 0", otelamqp.MetricCredentialRefreshes, n)
	}
	got, ok := floatGauge(rm, otelamqp.MetricCredentialExpiry, drainer)
	if !ok || got <= unix(login.Expires) || got < unix(before.Expires) || got > unix(after.Expires) {
		t.Errorf("%s after the refresh = %v (reported %v), want past the login's %v, within [%v, %v]",
			otelamqp.MetricCredentialExpiry, got, ok, unix(login.Expires), unix(before.Expires), unix(after.Expires))
	}

	// Upstream mode calls no Observer, but refreshes with SafeRecovery:
	// RegisterStats reports its expiry all the same.
	up, err := amqp.DialConfig(url, amqp.Config{SafeRecovery: true, Credentials: provider})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { _ = up.Close() })
	unregisterUp, err := otelamqp.RegisterStats(up, tel.options()...)
	if err != nil {
		t.Fatalf("RegisterStats: %v", err)
	}
	t.Cleanup(func() { _ = unregisterUp() })
	upstream := attribute.String("amqp091.read_mode", "upstream")
	if _, ok := floatGauge(tel.collect(t), otelamqp.MetricCredentialExpiry, upstream); !ok {
		t.Errorf("%s not reported in upstream mode with SafeRecovery", otelamqp.MetricCredentialExpiry)
	}
}

// unix is how amqp091.credential.expiry writes a time.
func unix(at time.Time) float64 { return float64(at.Unix()) + float64(at.Nanosecond())/1e9 }

// floatGauge returns the value of the float64 gauge called name whose
// attributes include match, and whether there is one.
func floatGauge(rm metricdata.ResourceMetrics, name string, match ...attribute.KeyValue) (float64, bool) {
	m := findMetric(rm, name)
	if m == nil {
		return 0, false
	}
	g, _ := m.Data.(metricdata.Gauge[float64])
next:
	for _, p := range g.DataPoints {
		for _, kv := range match {
			if v, ok := p.Attributes.Value(kv.Key); !ok || v != kv.Value {
				continue next
			}
		}
		return p.Value, true
	}
	return 0, false
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
