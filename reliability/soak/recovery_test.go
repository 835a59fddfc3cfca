package soak

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// TestChannelCloseDuringRecovery pins down an upstream v1.16.0 behaviour
// the soak's churner ran into: closing a Channel while its connection is
// down and automatic recovery is pending poisons that recovery.
//
// Channel.Close on a channel the loss has already marked closed returns
// nil at once, without removing it from the connection (releaseChannel
// only removes channels of an open connection). Every recovery attempt
// then reopens the connection, reaches the closed channel in its list,
// gets amqp.ErrClosed (504) from it because Close marked it, and throws
// the new connection away. Recovery never succeeds: after MaxRetryCount
// attempts, every one of which dialled and opened a connection, it gives
// up and the connection, with all its other channels, is closed for good.
//
// Mitigation: close channels only while the connection says StateOpen;
// since that check cannot be atomic with Close (a Close in flight when the
// connection drops is left registered just the same), also bound recovery
// yourself and replace a connection that is not back to StateOpen in time
// or that a recovery closed. Or, as the soak's churner does, use a retry
// loop of your own rather than automatic recovery where channels come and
// go.
func TestChannelCloseDuringRecovery(t *testing.T) {
	lvl := level.Require(t)
	retries := level.Pick(lvl, 3, 10)
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()
	var dials atomic.Int64
	conn, err := drainer.DialConfig(proxy.URL(), amqp.Config{
		Recovery: &amqp.Recovery{ReconnectionConfig: &amqp.ReconnectionConfig{MaxRetryCount: retries, RetryInterval: 100 * time.Millisecond}},
		Dial: func(network, addr string) (net.Conn, error) {
			dials.Add(1)
			return amqp.DefaultDial(30*time.Second)(network, addr)
		},
	}, drainer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	states := make(chan *amqp.StateChanged, 64)
	conn.NotifyStateChange(states)
	kept, closed := testenv.Channel(t, conn), testenv.Channel(t, conn)

	toxic := proxy.ResetPeer(toxi.Upstream, 0)
	poke(kept) // its frame meets the reset
	awaitTransition(t, states, amqp.StateReconnecting)
	// The connection's shutdown marks its channels closed after it has
	// notified the watcher that starts recovery, so this may lag a little.
	if !waitFor(closed.IsClosed, 30*time.Second) {
		t.Fatal("the channel is not marked closed while its connection is recovering")
	}
	if err := closed.Close(); err != nil {
		t.Fatalf("Close during recovery = %v; this test assumed upstream's nil", err)
	}
	before := dials.Load()
	proxy.RemoveToxic(toxic)

	// Recovery now dials and opens a connection on every attempt, and
	// gives up anyway.
	end := awaitEither(t, states, amqp.StateOpen, amqp.StateClosed)
	attempts := dials.Load() - before
	t.Logf("after closing a channel during recovery: the connection went to %v after %d redials (MaxRetryCount %d)", end.To, attempts, retries)
	if end.To != amqp.StateClosed {
		t.Fatalf("recovery succeeded after a channel was closed during it; upstream may have fixed this, revisit the churner's mitigation")
	}
	if attempts < int64(retries) {
		t.Errorf("recovery gave up after %d redials, want all %d (each one reached the broker)", attempts, retries)
	}
	if !kept.IsClosed() || !conn.IsClosed() {
		t.Error("the connection and its other channel should be closed for good")
	}
	if err := kept.Qos(1, 0, false); err == nil {
		t.Error("an RPC on the other channel succeeded after recovery gave up")
	}

	// The same close once recovery has finished is harmless.
	t.Run("after StateOpen", func(t *testing.T) {
		conn, err := drainer.DialConfig(proxy.URL(), amqp.Config{
			Recovery: &amqp.Recovery{ReconnectionConfig: &amqp.ReconnectionConfig{MaxRetryCount: retries, RetryInterval: 100 * time.Millisecond}},
		}, drainer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		states := make(chan *amqp.StateChanged, 64)
		conn.NotifyStateChange(states)
		kept, closed := testenv.Channel(t, conn), testenv.Channel(t, conn)
		toxic := proxy.ResetPeer(toxi.Upstream, 0)
		poke(kept)
		awaitTransition(t, states, amqp.StateReconnecting)
		proxy.RemoveToxic(toxic)
		awaitTransition(t, states, amqp.StateOpen)
		if err := closed.Close(); err != nil {
			t.Fatalf("Close after recovery: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		q := testenv.ExclusiveQueue(t, kept)
		if err := kept.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatalf("publish on the recovered channel: %v", err)
		}
	})
}

// poke sends a harmless frame on ch (a publish nobody receives), to meet
// a reset toxic.
func poke(ch *amqp.Channel) {
	_ = ch.PublishWithContext(context.Background(), "", "reliability-soak-nowhere", false, false, amqp.Publishing{})
}

// awaitTransition reads state notifications until one goes to want.
func awaitTransition(t *testing.T, states <-chan *amqp.StateChanged, want amqp.LifeCycleState) {
	t.Helper()
	if got := awaitEither(t, states, want, want); got.To != want {
		t.Fatalf("the connection went to %v, want %v", got.To, want)
	}
}

// awaitEither reads state notifications until one goes to a or b, within
// a bound generous enough for every retry of recovery.
func awaitEither(t *testing.T, states <-chan *amqp.StateChanged, a, b amqp.LifeCycleState) *amqp.StateChanged {
	t.Helper()
	const bound = 2 * time.Minute
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case s, ok := <-states:
			if !ok {
				t.Fatalf("the state notifications ended before %v or %v", a, b)
			}
			if s.To == a || s.To == b {
				return s
			}
		case <-timer.C:
			t.Fatalf("no transition to %v or %v within %v", a, b, bound)
		}
	}
}
