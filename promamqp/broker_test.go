package promamqp_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/promamqp"
)

func brokerURL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// TestBroker runs a known workload through a drainer-mode connection on a
// real broker and checks that the Observer's counters match it exactly
// and that the Stats series agree with the connection's own Stats.
func TestBroker(t *testing.T) {
	const (
		n      = 100
		budget = 4 << 20
		body   = "promamqp broker test message"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	metrics := promamqp.New()
	// The Connection events are the only ones the test cannot order by
	// the client's API alone: wrap that func to hear of the close, and
	// keep the Collector's funcs for everything else. The other counts are
	// ordered by the calls that cause them: Published and Settled run
	// inside the publish and ack calls, Delivered before the delivery is
	// queued for the consumer, and Confirmed before the
	// DeferredConfirmation it counts is settled.
	obs := *metrics.Observer()
	events := make(chan amqp.ConnectionEvent, 8)
	count := obs.Connection
	obs.Connection = func(ev amqp.ConnectionEvent) {
		count(ev)
		events <- ev
	}

	conn, err := amqp.DialConfig(brokerURL(), amqp.Config{
		Dial:     amqp.DefaultDial(5 * time.Second),
		ReadPath: amqp.Drainer(amqp.DrainerOptions{Budget: budget, Observer: &obs}),
	})
	if err != nil {
		t.Fatalf("no RabbitMQ at %s (%v): start one with `rabbitmq-server -detached`, "+
			"or `docker run -d -p 5672:5672 rabbitmq:4`, or point AMQP_URL at one", brokerURL(), err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = conn.Close()
		}
	}()
	metrics.Watch("test", conn)

	if ev := <-events; ev.Kind != amqp.ConnectionOpened || ev.Mode != "drainer" {
		t.Fatalf("first connection event %v in mode %q, want opened in drainer", ev.Kind, ev.Mode)
	}

	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	dcs := make([]*amqp.DeferredConfirmation, 0, n)
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false,
			amqp.Publishing{Body: fmt.Appendf(nil, "%s %03d", body, i)})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		dcs = append(dcs, dc)
	}
	for i, dc := range dcs {
		ok, err := dc.WaitContext(ctx)
		if err != nil || !ok {
			t.Fatalf("publish %d not confirmed: ok %v, %v", i, ok, err)
		}
	}

	deliveries, err := ch.ConsumeWithContext(ctx, q.Name, "", false, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("deliveries closed after %d", i)
			}
			if err := d.Ack(false); err != nil {
				t.Fatalf("ack %d: %v", i, err)
			}
		case <-ctx.Done():
			t.Fatalf("got %d deliveries of %d: %v", i, n, ctx.Err())
		}
	}

	// The Stats series, bracketed by two snapshots: a counter scraped
	// between them must lie between their values (heartbeats may move
	// them meanwhile).
	before := conn.Stats()
	mfs := gather(t, metrics)
	after := conn.Stats()
	conn1 := map[string]string{"connection": "test"}

	want := map[string]float64{
		"amqp091_published_total":      n,
		"amqp091_publish_errors_total": 0,
		"amqp091_delivered_total":      n,
		"amqp091_returned_total":       0,
	}
	for name, v := range want {
		if got := value(t, mfs, name, nil); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
	for labels, v := range map[[2]string]float64{
		{"outcome", "ack"}: n, {"outcome", "nack"}: 0,
	} {
		if got := value(t, mfs, "amqp091_confirmed_total", map[string]string{labels[0]: labels[1]}); got != v {
			t.Errorf("confirmed_total{%s=%q} = %v, want %v", labels[0], labels[1], got, v)
		}
	}
	for kind, v := range map[string]float64{"ack": n, "nack": 0, "reject": 0} {
		if got := value(t, mfs, "amqp091_settled_total", map[string]string{"kind": kind}); got != v {
			t.Errorf("settled_total{kind=%q} = %v, want %v", kind, got, v)
		}
	}
	if m := find(mfs, "amqp091_confirm_latency_seconds", nil); m.GetHistogram().GetSampleCount() != n {
		t.Errorf("confirm latency observed %d confirms, want %d", m.GetHistogram().GetSampleCount(), n)
	}
	for _, method := range []string{"channel.open", "confirm.select", "queue.declare", "basic.consume"} {
		m := find(mfs, "amqp091_rpc_seconds", map[string]string{"method": method})
		if m == nil || m.GetHistogram().GetSampleCount() != 1 {
			t.Errorf("rpc_seconds{method=%q}: %v, want one call", method, m)
		}
	}

	if got := value(t, mfs, "amqp091_connection_info", map[string]string{"connection": "test", "mode": "drainer"}); got != 1 {
		t.Errorf("connection_info = %v", got)
	}
	if got := value(t, mfs, "amqp091_budget_limit_bytes", conn1); got != budget {
		t.Errorf("budget_limit_bytes = %v, want %v", got, budget)
	}
	if got := value(t, mfs, "amqp091_budget_paused", conn1); got != 0 {
		t.Errorf("budget_paused = %v with 100 small messages", got)
	}
	counters := []struct {
		name          string
		before, after uint64
		least         uint64 // what the workload alone must have moved
	}{
		// Each publish is a method, a header and a body frame; each ack
		// one method frame.
		{"amqp091_frames_sent_total", before.FramesOut, after.FramesOut, 3*n + n},
		// Each delivery is three frames too; at least one confirm arrived.
		{"amqp091_frames_received_total", before.FramesIn, after.FramesIn, 3*n + 1},
		// Every frame carries 8 bytes of framing; the bodies come on top.
		{"amqp091_bytes_sent_total", before.BytesOut, after.BytesOut, 8*(3*n+n) + n*uint64(len(body))},
		{"amqp091_bytes_received_total", before.BytesIn, after.BytesIn, 8*(3*n+1) + n*uint64(len(body))},
		// Every publish is at least its own write, without coalescing.
		{"amqp091_socket_writes_total", before.Writes, after.Writes, n},
	}
	for _, c := range counters {
		got := value(t, mfs, c.name, conn1)
		if got < float64(c.before) || got > float64(c.after) {
			t.Errorf("%s = %v, outside the snapshots around the scrape [%d, %d]", c.name, got, c.before, c.after)
		}
		if got < float64(c.least) {
			t.Errorf("%s = %v, less than the workload's %d", c.name, got, c.least)
		}
	}
	// Bytes per frame: at least the framing, and frames at least one per
	// 8 bytes, which catches a Stats that swapped or mixed up its fields.
	for _, dir := range []struct{ frames, bytes string }{
		{"amqp091_frames_sent_total", "amqp091_bytes_sent_total"},
		{"amqp091_frames_received_total", "amqp091_bytes_received_total"},
	} {
		f, b := value(t, mfs, dir.frames, conn1), value(t, mfs, dir.bytes, conn1)
		if b < 8*f {
			t.Errorf("%s = %v but %s = %v: less than 8 bytes a frame", dir.bytes, b, dir.frames, f)
		}
	}
	if got := value(t, mfs, "amqp091_consumer_queued", conn1); got != 0 {
		t.Errorf("consumer_queued = %v after every delivery was received", got)
	}

	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	select {
	case ev := <-events:
		if ev.Kind != amqp.ConnectionClosed {
			t.Errorf("connection event after Close: %v (%v), want closed", ev.Kind, ev.Err)
		}
	case <-ctx.Done():
		t.Fatal("no connection event after Close")
	}
	mfs = gather(t, metrics)
	for kind, v := range map[string]float64{"opened": 1, "closed": 1, "failed": 0, "recovered": 0} {
		if got := value(t, mfs, "amqp091_connection_events_total", map[string]string{"kind": kind}); got != v {
			t.Errorf("connection_events_total{kind=%q} = %v, want %v", kind, got, v)
		}
	}
	// A closed connection's Stats still answer: the series stay until
	// Unwatch.
	if find(mfs, "amqp091_bytes_sent_total", conn1) == nil {
		t.Error("closed connection's series gone before Unwatch")
	}
	metrics.Unwatch("test")
	if find(gather(t, metrics), "amqp091_bytes_sent_total", conn1) != nil {
		t.Error("series still there after Unwatch")
	}
	if _, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false, amqp.Publishing{}); !errors.Is(err, amqp.ErrClosed) {
		t.Errorf("publish after Close: %v, want ErrClosed", err)
	}
	if got := value(t, gather(t, metrics), "amqp091_publish_errors_total", nil); got != 1 {
		t.Errorf("publish_errors_total = %v after one publish on a closed channel, want 1", got)
	}
}

// TestBrokerCredentialRefresh logs in with credentials that expire 1.5 s
// later, as an OAuth 2 token would, and checks the credential series
// against the connection's Stats before and after the refresh that comes
// at 80% of that lifetime. The provider answers with the URL's own user
// and password each time, which the
// broker's default (internal) backend takes with update-secret.
func TestBrokerCredentialRefresh(t *testing.T) {
	const lifetime = 1500 * time.Millisecond
	uri, err := amqp.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	metrics := promamqp.New()
	// The Collector leaves Refreshed nil (Stats counts refreshes): set it
	// on a copy, to hear of the refresh without sleeping.
	obs := *metrics.Observer()
	refreshed := make(chan amqp.RefreshInfo, 1)
	obs.Refreshed = func(ri amqp.RefreshInfo) {
		select {
		case refreshed <- ri:
		default: // a later refresh nobody waits for
		}
	}
	conn, err := amqp.DialConfig(brokerURL(), amqp.Config{
		Dial:     amqp.DefaultDial(5 * time.Second),
		ReadPath: amqp.Drainer(amqp.DrainerOptions{Observer: &obs}),
		Credentials: func(context.Context) (amqp.Authentication, error) {
			return amqp.ExpiringAuth{
				Authentication: &amqp.PlainAuth{Username: uri.Username, Password: uri.Password},
				Expires:        time.Now().Add(lifetime),
			}, nil
		},
	})
	if err != nil {
		t.Fatalf("no RabbitMQ at %s: %v", brokerURL(), err)
	}
	defer conn.Close()
	metrics.Watch("oauth", conn)
	conn1 := map[string]string{"connection": "oauth"}

	// unix is how the gauge writes a time.
	unix := func(at time.Time) float64 { return float64(at.Unix()) + float64(at.Nanosecond())/1e9 }
	login := conn.Stats().Credentials
	if login.Expires.IsZero() || login.Refreshes != 0 {
		t.Fatalf("Stats.Credentials after the login: %+v, want its expiry and no refresh", login)
	}
	mfs := gather(t, metrics)
	if got := value(t, mfs, "amqp091_credential_expiry_timestamp_seconds", conn1); got != unix(login.Expires) {
		t.Errorf("expiry before the refresh = %v, want the login's %v", got, unix(login.Expires))
	}

	select {
	case ri := <-refreshed:
		if ri.Err != nil {
			t.Fatalf("refresh failed: %v", ri.Err)
		}
	case <-time.After(10 * lifetime):
		t.Fatal("no refresh within 10 lifetimes")
	}
	// A later refresh may land during the scrape: bracket it with Stats.
	before := conn.Stats().Credentials
	mfs = gather(t, metrics)
	after := conn.Stats().Credentials
	if got := value(t, mfs, "amqp091_credential_refreshes_total", conn1); got < 1 ||
		got < float64(before.Refreshes) || got > float64(after.Refreshes) {
		t.Errorf("credential_refreshes_total = %v, want at least 1 and within [%d, %d]",
			got, before.Refreshes, after.Refreshes)
	}
	if got := value(t, mfs, "amqp091_credential_refresh_errors_total", conn1); got != 0 {
		t.Errorf("credential_refresh_errors_total = %v, want 0", got)
	}
	got := value(t, mfs, "amqp091_credential_expiry_timestamp_seconds", conn1)
	if got <= unix(login.Expires) || got < unix(before.Expires) || got > unix(after.Expires) {
		t.Errorf("expiry after the refresh = %v, want past the login's %v, within [%v, %v]",
			got, unix(login.Expires), unix(before.Expires), unix(after.Expires))
	}
}
