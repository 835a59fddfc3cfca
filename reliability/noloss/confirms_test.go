package noloss

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/queue"
)

// TestConfirmationsAtLoss pins down what becomes of a publisher
// confirmation owed when the connection is lost, in drainer mode, without
// and with upstream's automatic recovery. The message is in flight for
// sure: a timeout toxic holds the broker's ack back, then a reset kills
// the connection.
//
// Without recovery the DeferredConfirmation resolves at once, not acked,
// and the NotifyPublish listener is closed: the caller knows everything
// unconfirmed must be republished.
//
// With recovery it is not resolved at the loss: it stays pending while
// recovery redials, and is resolved not acked (Wait returns false, no
// error) when recovery reopens the channel. The NotifyPublish listener is
// never told: it stays open, receives no confirmation for the lost tags,
// and the recovered channel numbers its publishes from 1 again, so tags
// repeat. A caller that maps NotifyPublish tags to messages would take a
// later ack for the message that was lost under the same tag; with
// recovery, correlate through DeferredConfirmation, or drop the tag map
// on every Reconnecting→Open transition and republish all it held.
//
// The full level repeats each case, since the faults race the client.
func TestConfirmationsAtLoss(t *testing.T) {
	lvl := level.Require(t)
	for i := range level.Pick(lvl, 1, 3) {
		t.Run(fmt.Sprintf("without recovery/%d", i), func(t *testing.T) { confirmationAtLoss(t, false) })
		t.Run(fmt.Sprintf("with recovery/%d", i), func(t *testing.T) { confirmationAtLoss(t, true) })
	}
}

func confirmationAtLoss(t *testing.T, withRecovery bool) {
	q := queue.Durable(t, "reliability-noloss-")
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()

	// Counting dials shows recovery at work: its redials go through
	// Config.Dial too.
	var dials atomic.Int64
	cfg := amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		dials.Add(1)
		return amqp.DefaultDial(30*time.Second)(network, addr)
	}}
	if withRecovery {
		cfg.Recovery = recovery()
	}
	w := dialWatched(t, proxy.URL(), cfg, dialDrainer)
	ch, closes, connStates, chStates := w.ch, w.closes, w.connStates, w.chStates
	listener := ch.NotifyPublish(make(chan amqp.Confirmation, 16))

	publish := func(id string) (*amqp.DeferredConfirmation, error) {
		return ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false,
			amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent})
	}
	mustPublish := func(id string) *amqp.DeferredConfirmation {
		t.Helper()
		dc, err := publish(id)
		if err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
		return dc
	}

	if dc := mustPublish("m1"); !waitAck(t, dc) {
		t.Fatal("m1 was not acked on a healthy connection")
	}
	expectConfirmations(t, listener, amqp.Confirmation{DeliveryTag: 1, Ack: true})

	stall := proxy.Timeout(toxi.Downstream, 0) // the broker's ack for m2 never arrives
	dc2 := mustPublish("m2")
	reset := proxy.ResetPeer(toxi.Upstream, 0)
	dc3, err3 := publish("m3") // its frames meet the reset
	lostAt := time.Now()

	if !withRecovery {
		awaitClose(t, closes)
		proxy.RemoveToxic(stall)
		proxy.RemoveToxic(reset)
		resolved := awaitDone(t, dc2, "m2's confirmation after the loss")
		t.Logf("without recovery: m2's confirmation resolved %v after the loss, acked=%v; m3: err=%v", resolved.Sub(lostAt).Round(time.Millisecond), dc2.Acked(), err3)
		assertNotAcked(t, dc2, "m2", nil)
		if dc3 != nil {
			awaitDone(t, dc3, "m3's confirmation after the loss")
			assertNotAcked(t, dc3, "m3", nil)
		}
		// The listener is closed, without a confirmation for the tags
		// owed: it cannot be mistaken for a live one.
		select {
		case c, ok := <-listener:
			if ok {
				t.Fatalf("the NotifyPublish listener got %+v after the loss, want it closed", c)
			}
		case <-time.After(eventBound):
			t.Fatal("the NotifyPublish listener was not closed after the loss")
		}
		return
	}

	awaitState(t, connStates, amqp.StateReconnecting, "the connection to start recovering")
	proxy.RemoveToxic(stall)
	// Let recovery fail at least once against the reset toxic: a dial
	// after the first redial only happens once that one failed.
	before := dials.Load()
	waitCond(t, "recovery to redial twice", func() bool { return dials.Load() >= before+2 })
	select {
	case <-dc2.Done():
		t.Fatal("m2's confirmation resolved while recovery was still failing; this suite assumes it waits for the channel to reopen")
	default:
	}
	t.Logf("with recovery: m2's confirmation still pending after %d failed redials (%v after the loss)", dials.Load()-before-1, time.Since(lostAt).Round(time.Millisecond))
	proxy.RemoveToxic(reset)
	awaitState(t, chStates, amqp.StateOpen, "recovery to reopen the channel")
	// Resolved before the StateOpen notification: when the channel was
	// reset, before channel.open (TestNaiveRepublishDuringRecovery).
	select {
	case <-dc2.Done():
	default:
		t.Fatal("m2's confirmation is still pending after the channel reopened")
	}
	// Drainer mode keeps recovery safe: WaitContext also says why.
	assertNotAcked(t, dc2, "m2", amqp.ErrStaleConfirmation)
	if dc3 != nil {
		assertNotAcked(t, dc3, "m3", amqp.ErrStaleConfirmation)
	}
	t.Logf("with recovery: m2's confirmation resolved not acked on reopening, %v after the loss; m3: err=%v", time.Since(lostAt).Round(time.Millisecond), err3)

	dc4, dc5 := mustPublish("m4"), mustPublish("m5")
	if !waitAck(t, dc4) || !waitAck(t, dc5) {
		t.Fatal("a publish on the recovered channel was not acked")
	}
	if dc4.DeliveryTag != 1 || dc5.DeliveryTag != 2 {
		t.Fatalf("the recovered channel tagged m4 and m5 %d and %d, want 1 and 2 (numbering restarts)", dc4.DeliveryTag, dc5.DeliveryTag)
	}
	// The next two confirmations the listener sees are m4's and m5's,
	// tags 1 and 2: nothing was said about tags 2 and 3 of the lost
	// generation, and tag 2 now means m5, not m2.
	expectConfirmations(t, listener, amqp.Confirmation{DeliveryTag: 1, Ack: true}, amqp.Confirmation{DeliveryTag: 2, Ack: true})
	t.Log("with recovery: the NotifyPublish listener got no confirmation for the lost tags 2 and 3, then tags 1 and 2 again for m4 and m5")
}

// TestNaiveRepublishDuringRecovery shows why the recovery publisher waits
// for StateOpen, and what safe recovery does about it. Recovery resolves
// the confirmations owed at the loss when it resets the channel, just
// before it sends channel.open and then confirm.select. A caller that
// republishes as soon as its confirmation says "not acked", as one would
// without recovery, publishes inside that handshake: upstream's Channel
// serialises publishes against each other, not against recovery's RPCs.
// Latency on the broker's replies widens the window so that the outcome
// does not depend on scheduling luck.
//
// In upstream's default mode it is always one of two failures:
//
//   - the republish goes out between channel.open and confirm.select-ok:
//     the client counts it as tag 1 but the broker does not, so every
//     confirmation is attributed one publish early and the last
//     publish's confirmation never comes (it waits forever without a
//     bound);
//   - its frames go out before channel.open or between the frames of
//     recovery's calls: the broker closes the connection (504 or 505),
//     and recovery keeps retrying the channel on the dead connection
//     until its retries run out before it redials.
//
// Either way nothing acked is lost, which TestAutomaticRecovery checks at
// scale with the mitigation in place. With safe recovery (drainer mode,
// or Config.SafeRecovery in default mode) the republish is refused with amqp.ErrChannelRecovering, nothing is
// sent, and publishes after StateOpen are numbered and confirmed right.
// The full level repeats each case.
func TestNaiveRepublishDuringRecovery(t *testing.T) {
	lvl := level.Require(t)
	safeUpstream := func(url string, cfg amqp.Config) (*amqp.Connection, error) {
		cfg.SafeRecovery = true
		return amqp.DialConfig(url, cfg)
	}
	for _, mode := range []struct {
		name string
		dial dialFunc
		safe bool
	}{{"upstream", amqp.DialConfig, false}, {"upstream-safe", safeUpstream, true}, {"drainer", dialDrainer, true}} {
		for i := range level.Pick(lvl, 1, 3) {
			t.Run(fmt.Sprintf("%s/%d", mode.name, i), func(t *testing.T) { naiveRepublish(t, mode.dial, mode.safe) })
		}
	}
}

func naiveRepublish(t *testing.T, dial dialFunc, safe bool) {
	q := queue.Durable(t, "reliability-noloss-")
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()
	w := dialWatched(t, proxy.URL(), amqp.Config{Recovery: &amqp.Recovery{
		ReconnectionConfig: &amqp.ReconnectionConfig{MaxRetryCount: 10, RetryInterval: 100 * time.Millisecond},
	}}, dial)
	ch, closes, connStates := w.ch, w.closes, w.connStates
	publish := func(id string) (*amqp.DeferredConfirmation, error) {
		return ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false,
			amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent})
	}

	latency := proxy.Latency(toxi.Downstream, 300*time.Millisecond, 0)
	reset := proxy.ResetPeer(toxi.Upstream, 0)
	dc1, err := publish("m1") // its frames meet the reset
	if err != nil {
		t.Fatalf("publish m1: %v", err)
	}

	// The naive caller: republish the moment the confirmation says no.
	type republished struct {
		dc  *amqp.DeferredConfirmation
		err error
	}
	naive := make(chan republished, 1)
	go func() {
		select {
		case <-dc1.Done():
		case <-time.After(eventBound):
			naive <- republished{err: context.DeadlineExceeded}
			return
		}
		dc, err := publish("m1")
		naive <- republished{dc, err}
	}()

	awaitState(t, connStates, amqp.StateReconnecting, "the connection to start recovering")
	proxy.RemoveToxic(reset)
	var re republished
	select {
	case re = <-naive:
	case <-time.After(eventBound):
		t.Fatal("m1's confirmation did not resolve during recovery")
	}
	if safe {
		if !errors.Is(re.err, amqp.ErrChannelRecovering) || !errors.Is(re.err, amqp.ErrClosed) {
			t.Fatalf("the republish inside recovery's handshake: err = %v, want amqp.ErrChannelRecovering, wrapping amqp.ErrClosed", re.err)
		}
		awaitState(t, connStates, amqp.StateOpen, "recovery to finish")
		proxy.RemoveToxic(latency)
		safeRepublish(t, q, publish, closes, re.err)
		return
	}
	if re.err != nil {
		t.Fatalf("the naive republish of m1 failed: %v (recovery had reset the channel; IsClosed()=false)", re.err)
	}
	awaitState(t, connStates, amqp.StateOpen, "recovery to finish")
	proxy.RemoveToxic(latency)

	dc2, err := publish("m2")
	if err != nil {
		t.Fatalf("publish m2 after recovery: %v", err)
	}
	// A healthy ack takes milliseconds; 5 s is plenty even under -race.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack1, err1 := re.dc.WaitContext(ctx)
	ack2, err2 := dc2.WaitContext(ctx)
	broker := brokerErrors(closes)
	found := make(map[string]int)
	queue.Drain(t, q, func(d amqp.Delivery) { found[d.MessageId]++ })
	t.Logf("republished m1 (tag %d): acked=%v err=%v; m2 (tag %d): acked=%v err=%v; broker errors: %q; queue: %v",
		re.dc.DeliveryTag, ack1, err1, dc2.DeliveryTag, ack2, err2, broker, found)
	// Whatever the outcome, what was lost is a confirmation, not a
	// message: everything acked is in the queue, and so is m2.
	if ack1 && found["m1"] == 0 {
		t.Error("m1 was acked but is not in the queue")
	}
	if ack2 && found["m2"] == 0 {
		t.Error("m2 was acked but is not in the queue")
	}
	switch {
	case len(broker) > 0:
		t.Logf("outcome: the republish broke recovery's handshake; the broker closed the connection")
	case err2 != nil && ack1:
		t.Logf("outcome: the republish went out before confirm.select: tags shifted by one, m2's confirmation never came")
		if found["m2"] == 0 {
			t.Error("m2's confirmation never came and m2 is not in the queue either")
		}
	default:
		t.Errorf("the naive republish was harmless this time; if upstream now resolves confirmations after the channel is reopened, revisit the StateOpen wait in runRecovery")
	}
}

// safeRepublish is the end of naiveRepublish with safe recovery: the
// republish inside the handshake was refused (refused is its error), and
// m1 and m2, published once the channel is open again, are the recovered
// channel's tags 1 and 2, both acked, both in the queue, with no broker
// error on the way.
func safeRepublish(t *testing.T, q string, publish func(string) (*amqp.DeferredConfirmation, error), closes <-chan *amqp.Error, refused error) {
	t.Helper()
	dc1, err1 := publish("m1")
	dc2, err2 := publish("m2")
	if err1 != nil || err2 != nil {
		t.Fatalf("publishes after StateOpen: m1: %v, m2: %v", err1, err2)
	}
	if dc1.DeliveryTag != 1 || dc2.DeliveryTag != 2 {
		t.Fatalf("the recovered channel tagged m1 and m2 %d and %d, want 1 and 2", dc1.DeliveryTag, dc2.DeliveryTag)
	}
	if !waitAck(t, dc1) || !waitAck(t, dc2) {
		t.Fatal("a publish after StateOpen was not acked")
	}
	// The reset itself is on closes; a broken handshake would follow it.
	if broker := brokerErrors(closes); len(broker) > 0 {
		t.Fatalf("the broker closed the connection during recovery: %q", broker)
	}
	found := make(map[string]int)
	queue.Drain(t, q, func(d amqp.Delivery) { found[d.MessageId]++ })
	if found["m1"] == 0 || found["m2"] != 1 {
		t.Fatalf("queue: %v; want m1 (the lost first publish may be there too) and m2 once", found)
	}
	t.Logf("safe recovery: the republish inside the handshake was refused (%v); after StateOpen m1 and m2 were tags 1 and 2, acked; queue: %v", refused, found)
}

// brokerErrors drains closes and returns the closes that a frame inside
// recovery's handshake causes (504 channel error, 505 unexpected frame);
// the loss that started the recovery is not one of them.
func brokerErrors(closes <-chan *amqp.Error) (broker []string) {
	for {
		select {
		case e := <-closes:
			if e != nil && (e.Code == amqp.ChannelError || e.Code == amqp.UnexpectedFrame) {
				broker = append(broker, e.Error())
			}
		default:
			return broker
		}
	}
}

// waitAck waits, within confirmBound, for dc and reports whether it was
// an ack.
func waitAck(t *testing.T, dc *amqp.DeferredConfirmation) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), confirmBound)
	defer cancel()
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		t.Fatalf("confirmation for tag %d: %v", dc.DeliveryTag, err)
	}
	return ok
}

// awaitDone waits, within eventBound, for dc to resolve and returns when.
func awaitDone(t *testing.T, dc *amqp.DeferredConfirmation, what string) time.Time {
	t.Helper()
	select {
	case <-dc.Done():
		return time.Now()
	case <-time.After(eventBound):
		t.Fatalf("%s: still pending after %v", what, eventBound)
		return time.Time{}
	}
}

// assertNotAcked checks a resolved confirmation reads as not acked, the
// same through Acked and through WaitContext, whose error is want: nil
// for a confirmation the loss itself ended (upstream's), and
// amqp.ErrStaleConfirmation for one a recovery ended with safe recovery.
func assertNotAcked(t *testing.T, dc *amqp.DeferredConfirmation, id string, want error) {
	t.Helper()
	if dc.Acked() {
		t.Fatalf("%s's confirmation is an ack, though the broker's ack never reached the client", id)
	}
	ok, err := dc.WaitContext(context.Background())
	if ok || !errors.Is(err, want) || (want == nil && err != nil) {
		t.Fatalf("%s: WaitContext = %v, %v; want false, %v", id, ok, err, want)
	}
}

// expectConfirmations reads the next confirmations from l and checks them.
func expectConfirmations(t *testing.T, l <-chan amqp.Confirmation, want ...amqp.Confirmation) {
	t.Helper()
	for i, w := range want {
		select {
		case got, ok := <-l:
			if !ok {
				t.Fatalf("the NotifyPublish listener closed before confirmation %d", i+1)
			}
			if got != w {
				t.Fatalf("NotifyPublish confirmation %d = %+v, want %+v", i+1, got, w)
			}
		case <-time.After(eventBound):
			t.Fatalf("NotifyPublish confirmation %d (%+v) never came", i+1, w)
		}
	}
}

// watched is a connection with a channel in confirm mode, and the
// notifications the no-loss tests wait on.
type watched struct {
	conn                 *amqp.Connection
	ch                   *amqp.Channel
	closes               <-chan *amqp.Error
	connStates, chStates <-chan *amqp.StateChanged
}

// dialFunc dials a connection in one read mode.
type dialFunc func(url string, cfg amqp.Config) (*amqp.Connection, error)

// dialDrainer dials in drainer mode with the default options.
func dialDrainer(url string, cfg amqp.Config) (*amqp.Connection, error) {
	return drainer.DialConfig(url, cfg, drainer.Options{})
}

// dialWatched dials url with cfg through dial, opens a confirming channel
// and listens to the connection's close and both state changes. The
// connection is closed when the test ends.
func dialWatched(t *testing.T, url string, cfg amqp.Config, dial dialFunc) watched {
	t.Helper()
	conn, err := dial(url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	w := watched{conn: conn, closes: conn.NotifyClose(make(chan *amqp.Error, 16))}
	connStates := make(chan *amqp.StateChanged, 64)
	conn.NotifyStateChange(connStates)
	w.ch = testenv.Channel(t, conn)
	if err := w.ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	chStates := make(chan *amqp.StateChanged, 64)
	w.ch.NotifyStateChange(chStates)
	w.connStates, w.chStates = connStates, chStates
	return w
}

func awaitClose(t *testing.T, closes <-chan *amqp.Error) {
	t.Helper()
	select {
	case e := <-closes:
		if e == nil {
			t.Fatal("the connection closed without an error")
		}
	case <-time.After(eventBound):
		t.Fatal("the connection did not notice the reset")
	}
}

// awaitState reads state notifications until one goes to want.
func awaitState(t *testing.T, states <-chan *amqp.StateChanged, want amqp.LifeCycleState, what string) {
	t.Helper()
	timer := time.NewTimer(eventBound)
	defer timer.Stop()
	for {
		select {
		case s, ok := <-states:
			if !ok {
				t.Fatalf("waiting for %s: the state notifications ended", what)
			}
			if s.To == want {
				return
			}
		case <-timer.C:
			t.Fatalf("waited %v for %s", eventBound, what)
		}
	}
}

// waitCond polls cond, within eventBound.
func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(t, nil, what, cond)
}
