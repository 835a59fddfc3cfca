package noloss

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/ledger"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/queue"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Bounds. The runs share two cores with the broker and Toxiproxy under
// -race, so each is generous; none is a pause.
const (
	// confirmBound is how long one confirmation may take, across a
	// recovery included; a confirmation that takes longer counts as
	// silently dropped.
	confirmBound = 30 * time.Second
	// eventBound bounds every wait for a condition in the test goroutine.
	eventBound = 60 * time.Second
)

// plan is one run's shape.
type plan struct {
	resets  int // reset_peer faults to inject
	spacing int // IDs acked between two faults, and after the last
}

func planFor(lvl level.Level) plan {
	return plan{
		resets:  level.Pick(lvl, 3, 20),
		spacing: level.Pick(lvl, 300, 500),
	}
}

// TestRetryLoop runs a publisher without automatic recovery through
// repeated connection resets. It redials, reopens its channel, puts it in
// confirm mode and republishes every message whose confirmation was not
// an ack. Drainer mode resolves the confirmations owed at the loss as not
// acked, at once, so nothing waits for the bound.
func TestRetryLoop(t *testing.T) {
	lvl := level.Require(t)
	pl := planFor(lvl)
	q := queue.Durable(t, "reliability-noloss-")
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()

	led := ledger.New()
	pub := newPublisher(led, q, confirmBound, giveUpAfter(pl))
	url := proxy.URL()
	done := pub.start(t, func() error { return pub.runRetryLoop(url) })

	inject(t, proxy, pl, led, pub.losses.Load, done)
	close(pub.stop)
	awaitPublisher(t, done)
	verify(t, led, q, pub, pl)
}

// TestAutomaticRecovery runs a publisher on a connection with upstream's
// automatic recovery (Config.Recovery) through the same faults. It never
// redials: after a loss it waits for the channel's StateOpen notification,
// as upstream's Reconnect documentation asks, and republishes what was
// not acked on the same channel.
//
// What it relies on, and TestConfirmationsAtLoss pins down: recovery does
// not resolve the confirmations owed at the loss when the connection
// drops; it resolves them "not acked" (Wait returns false, no error) when
// it reopens the channel after redialling, and delivery tags restart at 1.
func TestAutomaticRecovery(t *testing.T) {
	lvl := level.Require(t)
	pl := planFor(lvl)
	q := queue.Durable(t, "reliability-noloss-")
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()

	conn, err := drainer.DialConfig(proxy.URL(), amqp.Config{Recovery: recovery()}, drainer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	// The connection's own transitions tell the injector a fault has
	// landed: under recovery the publisher learns of it only once the
	// connection is back, which needs the toxic removed first.
	var reconnecting atomic.Int64
	connStates := make(chan *amqp.StateChanged, 1024)
	conn.NotifyStateChange(connStates)
	go func() {
		for e := range connStates { // closed after the final StateClosed
			if e.To == amqp.StateReconnecting {
				reconnecting.Add(1)
			}
		}
	}()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	st := newChanStates(ch)

	led := ledger.New()
	pub := newPublisher(led, q, confirmBound, giveUpAfter(pl))
	done := pub.start(t, func() error { return pub.runRecovery(ch, st) })

	inject(t, proxy, pl, led, reconnecting.Load, done)
	close(pub.stop)
	awaitPublisher(t, done)
	if err := conn.Close(); err != nil {
		t.Errorf("Close after the run: %v", err)
	}
	t.Logf("connection recoveries: %d, channel recoveries seen by the publisher: %d", reconnecting.Load(), st.recoveries)
	verify(t, led, q, pub, pl)
}

// recovery is the automatic recovery configuration: quick retries, and
// enough of them to outlast the moment a reset toxic is in place.
func recovery() *amqp.Recovery {
	return &amqp.Recovery{ReconnectionConfig: &amqp.ReconnectionConfig{
		MaxRetryCount: 200,
		RetryInterval: 100 * time.Millisecond,
	}}
}

// giveUpAfter bounds a whole publisher: generous for the plan's size.
func giveUpAfter(pl plan) time.Duration {
	return time.Duration(pl.resets+1) * 2 * eventBound
}

// inject runs the faults from the test goroutine (toxi must be called
// from it): each time spacing more IDs have been acked, it adds a
// reset_peer toxic on the client-to-broker stream, which resets the
// connection at the publisher's next frame, waits until losses says the
// fault landed, and removes the toxic so that redials succeed. It returns
// once spacing more IDs are acked after the last fault.
func inject(t *testing.T, proxy *toxi.Proxy, pl plan, led *ledger.Ledger, losses func() int64, done <-chan error) {
	t.Helper()
	next := pl.spacing
	for i := 0; i <= pl.resets; i++ {
		waitFor(t, done, fmt.Sprintf("%d acked IDs before fault %d", next, i+1), func() bool { return led.Counts().AckedIDs >= next })
		if i == pl.resets {
			return
		}
		before := losses()
		toxic := proxy.ResetPeer(toxi.Upstream, 0)
		waitFor(t, done, fmt.Sprintf("fault %d to be noticed", i+1), func() bool { return losses() > before })
		proxy.RemoveToxic(toxic)
		next = led.Counts().AckedIDs + pl.spacing
	}
}

// waitFor polls cond until it holds, failing the test after eventBound or
// if the publisher returns early.
func waitFor(t *testing.T, done <-chan error, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(eventBound)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case err := <-done:
			t.Fatalf("the publisher returned while waiting for %s: %v", what, err)
		case <-deadline.C:
			t.Fatalf("waited %v for %s", eventBound, what)
		case <-tick.C:
		}
	}
}

func awaitPublisher(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("publisher: %v", err)
		}
	case <-time.After(2 * eventBound):
		t.Fatal("the publisher did not finish its retries")
	}
}

// verify reads the queue, prints the books and fails on any loss, any
// message nobody published, any confirmation not accounted for or never
// received, and any ID left unacked (the publisher retries until every ID
// is acked).
func verify(t *testing.T, led *ledger.Ledger, q string, pub *publisher, pl plan) {
	t.Helper()
	found := ledger.NewFound()
	queue.Drain(t, q, func(d amqp.Delivery) {
		if string(d.Body) != d.MessageId {
			t.Errorf("message %q has body %q", d.MessageId, d.Body)
		}
		found.Add(d.MessageId)
	})
	rep := led.Check(found)
	t.Logf("%d resets, %d losses seen by the publisher", pl.resets, pub.losses.Load())
	t.Logf("%v", rep)
	for _, n := range pub.notes {
		t.Logf("publisher: %s", n)
	}
	for _, p := range rep.Problems() {
		t.Error(p)
	}
	if rep.Unacked > 0 {
		t.Errorf("%d IDs were never acked, though the publisher retries until they are", rep.Unacked)
	}
	if got := pub.losses.Load(); got < int64(pl.resets) {
		t.Errorf("the publisher saw %d connection losses, want at least %d", got, pl.resets)
	}
}
