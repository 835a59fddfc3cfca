//go:build !pristine

package micro

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// The Observer's cost on the two hot paths. "none" is a connection without
// an Observer, which must keep the fast paths' allocations (0 per publish,
// 1 per delivery: TestObserverKeepsAllocations); "noop" sets every hook to
// a func that does nothing, which is the floor of any adapter (otelamqp,
// promamqp) and what a hook's call costs.

// noopObserver has every hook set, doing nothing.
func noopObserver() *amqp.Observer {
	return &amqp.Observer{
		BeforePublish:   func(ctx context.Context, _ amqp.PublishInfo, _ *amqp.Publishing) context.Context { return ctx },
		Published:       func(context.Context, amqp.PublishInfo, error) {},
		Confirmed:       func(amqp.ConfirmInfo) {},
		Returned:        func(*amqp.Return) {},
		Delivered:       func(*amqp.Delivery) {},
		Handled:         func(*amqp.Delivery, time.Duration, error) {},
		Settled:         func(amqp.SettleInfo) {},
		RPC:             func(amqp.RPCInfo) {},
		BudgetPaused:    func(amqp.BudgetInfo) {},
		BudgetResumed:   func(amqp.BudgetInfo) {},
		ListenerDropped: func(amqp.ListenerStats) {},
		Connection:      func(amqp.ConnectionEvent) {},
	}
}

// observerVariants are the Observers compared, by name.
var observerVariants = []struct {
	name string
	obs  func() *amqp.Observer
}{
	{"none", func() *amqp.Observer { return nil }},
	{"noop", noopObserver},
}

// observedReadPath is mode's read path with obs.
func observedReadPath(mode string, obs *amqp.Observer) amqp.ReadPath {
	if mode == "legacy" {
		return amqp.Legacy(amqp.LegacyOptions{Observer: obs})
	}
	return amqp.Drainer(amqp.DrainerOptions{Observer: obs})
}

// dialObserved is dial with an Observer, in drainer or legacy mode.
func dialObserved(b *testing.B, p *fakepeer.Peer, mode string, obs *amqp.Observer, wrap func(net.Conn) net.Conn) *amqp.Connection {
	b.Helper()
	cfg := amqp.Config{ReadPath: observedReadPath(mode, obs), Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 5*time.Second)
		if err != nil || wrap == nil {
			return c, err
		}
		return wrap(c), nil
	}}
	conn, err := amqp.DialConfig(p.URL()+"?heartbeat=0", cfg)
	if err != nil {
		b.Fatalf("dial %s: %v", mode, err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return conn
}

// BenchmarkObserverPublish is BenchmarkPublish (43-byte payload) per
// Observer variant.
func BenchmarkObserverPublish(b *testing.B) {
	for _, mode := range []string{"drainer", "legacy"} {
		for _, v := range observerVariants {
			b.Run("observer="+v.name+"/mode="+mode, func(b *testing.B) { benchObservedPublish(b, mode, v.obs()) })
		}
	}
}

func benchObservedPublish(b *testing.B, mode string, obs *amqp.Observer) {
	p := fakepeer.Listen(b)
	p.Serve(func(*fakepeer.Session) error { return nil })
	var sink *sinkConn
	conn := dialObserved(b, p, mode, obs, func(c net.Conn) net.Conn {
		sink = &sinkConn{Conn: c}
		return sink
	})
	ch, err := conn.Channel()
	if err != nil {
		b.Fatalf("channel: %v", err)
	}
	msg := amqp.Publishing{ContentType: "application/json", ContentEncoding: "utf-8", Body: bytes.Repeat([]byte{'x'}, 43)}
	sink.discard.Store(true)
	defer sink.discard.Store(false)
	b.ReportAllocs()
	for b.Loop() {
		if err := ch.PublishWithContext(b.Context(), "", "bench", false, false, msg); err != nil {
			b.Fatalf("publish: %v", err)
		}
	}
}

// BenchmarkObserverDeliver is BenchmarkDeliver (512-byte payload) per
// Observer variant.
func BenchmarkObserverDeliver(b *testing.B) {
	for _, mode := range []string{"drainer", "legacy"} {
		for _, v := range observerVariants {
			b.Run("observer="+v.name+"/mode="+mode, func(b *testing.B) { benchObservedDeliver(b, mode, v.obs()) })
		}
	}
}

func benchObservedDeliver(b *testing.B, mode string, obs *amqp.Observer) {
	n := b.N
	p := fakepeer.Listen(b)
	encoded, release := serveDeliveries(p, n, 512)
	receiveTimed(b, dialObserved(b, p, mode, obs, nil), mode, n, encoded, release)
}

// TestObserverKeepsAllocations holds the fast paths to their allocations:
// without an Observer 0 per publish and 1 per delivery received from a
// Consume chan (its body: the *Delivery is pooled once the chan took its
// copy), and a no-op Observer adds none.
func TestObserverKeepsAllocations(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("runs benchmarks, and counts allocations: not under -short or -race")
	}
	for _, mode := range []string{"drainer", "legacy"} {
		for _, v := range observerVariants {
			pub := testing.Benchmark(func(b *testing.B) { benchObservedPublish(b, mode, v.obs()) })
			del := testing.Benchmark(func(b *testing.B) { benchObservedDeliver(b, mode, v.obs()) })
			t.Logf("%s, observer %s: publish %d allocs/op %s; deliver %d allocs/op %s",
				mode, v.name, pub.AllocsPerOp(), pub.T/time.Duration(max(pub.N, 1)), del.AllocsPerOp(), del.T/time.Duration(max(del.N, 1)))
			if pub.AllocsPerOp() > 0 {
				t.Errorf("%s, observer %s: %d allocs per publish, want 0", mode, v.name, pub.AllocsPerOp())
			}
			if del.AllocsPerOp() > 1 {
				t.Errorf("%s, observer %s: %d allocs per delivery, want 1", mode, v.name, del.AllocsPerOp())
			}
		}
	}
}
