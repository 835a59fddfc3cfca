package failover

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The backed-off timeout, option by option: doubling from ConfirmTimeout
// up to MaxConfirmTimeout (4 × ConfirmTimeout by default), and off when
// the cap is at or below ConfirmTimeout.
func TestBackedOffConfirmTimeout(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		name       string
		confirm    time.Duration
		maxConfirm time.Duration
		want       []time.Duration // by streak, from 0
	}{
		{"default cap", s, 0, []time.Duration{s, 2 * s, 4 * s, 4 * s, 4 * s}},
		{"cap between doublings", s, 3 * s, []time.Duration{s, 2 * s, 3 * s, 3 * s}},
		{"cap at ConfirmTimeout: no backoff", s, s, []time.Duration{s, s, s}},
		{"cap below ConfirmTimeout: no backoff", s, s / 2, []time.Duration{s, s, s}},
		{"negative cap: no backoff", s, -1, []time.Duration{s, s}},
		{"large streak", s, 8 * s, []time.Duration{s, 2 * s, 4 * s, 8 * s, 8 * s, 8 * s}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Publisher{o: PublisherOptions{ConfirmTimeout: tc.confirm, MaxConfirmTimeout: tc.maxConfirm}.withDefaults()}
			for streak, want := range tc.want {
				if got := p.backedOff(streak); got != want {
					t.Errorf("streak %d: %v, want %v", streak, got, want)
				}
			}
			if got := p.backedOff(1000); got != p.o.MaxConfirmTimeout {
				t.Errorf("streak 1000: %v, want the cap %v", got, p.o.MaxConfirmTimeout)
			}
		})
	}
}

// The reopen delay: Backoff's, capped in a nack storm at a quarter of
// ConfirmTimeout and at 1 s, within Backoff's bounds.
func TestReopenDelay(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name    string
		o       PublisherOptions
		n       int
		storm   bool
		ceiling time.Duration // the delay before its jitter (up to 20 % less)
	}{
		{"channel closes back off to Backoff.Max", PublisherOptions{ConfirmTimeout: 2000 * ms}, 12, false, 5000 * ms},
		{"storm: a quarter of ConfirmTimeout", PublisherOptions{ConfirmTimeout: 2000 * ms}, 12, true, 500 * ms},
		{"storm, early: Backoff's own", PublisherOptions{ConfirmTimeout: 2000 * ms}, 2, true, 100 * ms},
		{"storm without ConfirmTimeout: 1 s", PublisherOptions{}, 12, true, 1000 * ms},
		{"storm, long ConfirmTimeout: 1 s", PublisherOptions{ConfirmTimeout: 60000 * ms}, 12, true, 1000 * ms},
		{"storm, Backoff.Max below the cap", PublisherOptions{ConfirmTimeout: 2000 * ms, Backoff: Backoff{Max: 200 * ms}}, 12, true, 200 * ms},
		{"storm, Backoff.Initial above the cap", PublisherOptions{ConfirmTimeout: 40 * ms, Backoff: Backoff{Initial: 50 * ms}}, 12, true, 50 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Publisher{o: tc.o.withDefaults()}
			for range 20 {
				if got := p.reopenDelay(tc.n, tc.storm); got > tc.ceiling || got < tc.ceiling*4/5 {
					t.Fatalf("reopenDelay(%d, %v) = %v, want %v less up to 20 %% jitter", tc.n, tc.storm, got, tc.ceiling)
				}
			}
		})
	}
}

// A broker that confirms on no node, as during the leader election that
// follows a cut of the leader's node: the first connection is abandoned
// after ConfirmTimeout; every later one answers the channel.open of its
// silent probe's replacement, which raises the timeout to
// MaxConfirmTimeout (default 4 × ConfirmTimeout), above the doubled one;
// an ack resets it, so that the next stall is abandoned after
// ConfirmTimeout again.
func TestConfirmTimeoutBacksOff(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		// Only confirms stall: connection.close is answered, so that
		// Close is quick (TestConfirmTimeoutAbandons covers a node that
		// leaves it unanswered).
		var stall atomic.Bool
		stall.Store(true)
		script := brokerScript{decide: func(published) action {
			if stall.Load() {
				return silent
			}
			return ack
		}, heartbeat: 200 * time.Millisecond}

		const timeout = 100 * time.Millisecond
		events := make(chan Event, 1000)
		p := newPublisher(t, PublisherOptions{
			Dial: peerPerDial(t, mode, script), ConfirmTimeout: timeout,
			Backoff: Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond},
			OnEvent: func(e Event) {
				select {
				case events <- e:
				default: // more than the test can use: never blocks the publisher
				}
			},
		})
		// Before the peers' cleanups, which would otherwise leave it
		// dialling new ones.
		defer p.Close()
		if st := p.Stats(); st.ConfirmTimeoutNow != timeout || st.AbandonStreak != 0 {
			t.Fatalf("stats before any publish %+v, want ConfirmTimeoutNow %v and no streak", st, timeout)
		}
		// next returns the next event of kind k, skipping others, bounded
		// generously.
		next := func(k EventKind) Event {
			t.Helper()
			bound := time.NewTimer(20 * time.Second)
			defer bound.Stop()
			for {
				select {
				case e := <-events:
					if e.Kind == k {
						return e
					}
				case <-bound.C:
					t.Fatalf("no %v event within 20 s; stats %+v", k, p.Stats())
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		first := make(chan error, 1)
		go func() { first <- p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("stalled")}) }()

		// Abandonments 1 to 4, all with the message unacked: the first
		// connection's message waits ConfirmTimeout, the others' 4 ×
		// ConfirmTimeout. The watchdog abandons only once the oldest
		// message has waited the timeout in force, and the message went
		// out once its channel was open, at most a scheduling slice before
		// the connected event (hence the margin); the upper bounds are
		// generous.
		up := next(EventConnected).Time
		wants := []time.Duration{timeout, 4 * timeout, 4 * timeout, 4 * timeout}
		var waited []time.Duration
		for k, want := range wants {
			ab := next(EventAbandon)
			w := ab.Time.Sub(up)
			waited = append(waited, w)
			if w < want-timeout/2 {
				t.Fatalf("abandonment %d after %v, before its timeout %v", k+1, w, want)
			}
			if w > want+5*time.Second {
				t.Fatalf("abandonment %d after %v, timeout %v", k+1, w, want)
			}
			if !strings.Contains(ab.Err.Error(), "confirm timeout "+want.String()) {
				t.Fatalf("abandonment %d: %v, want confirm timeout %v in it", k+1, ab.Err, want)
			}
			// Backed off, or already raised by the next connection's
			// silent probe.
			st := p.Stats()
			nextTimeout := min(timeout<<(k+1), 4*timeout)
			if st.AbandonStreak != k+1 || st.ConfirmTimeoutNow < nextTimeout || st.Abandons != uint64(k+1) {
				t.Fatalf("after abandonment %d: stats %+v, want streak %d, ConfirmTimeoutNow ≥ %v", k+1, st, k+1, nextTimeout)
			}
			if k < len(wants)-1 {
				up = next(EventConnected).Time
			}
		}

		// The broker confirms again: the message goes out on the next
		// connection and is acked, which resets the backoff.
		stall.Store(false)
		select {
		case err := <-first:
			if err != nil {
				t.Fatalf("Publish after the stall: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("Publish still waiting 20 s after the broker confirms again; stats %+v", p.Stats())
		}
		if st := p.Stats(); st.AbandonStreak != 0 || st.ConfirmTimeoutNow != timeout || st.Confirmed != 1 {
			t.Fatalf("after the ack: stats %+v, want no streak, ConfirmTimeoutNow %v, 1 confirmed", st, timeout)
		}
		// Forget what came before the ack (an abandonment of a connection
		// the message went out on just before the broker recovered).
		for len(events) > 0 {
			<-events
		}

		// A new stall is abandoned after ConfirmTimeout, not after the cap.
		stall.Store(true)
		start := time.Now()
		second := make(chan error, 1)
		go func() { second <- p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("stalled again")}) }()
		ab := next(EventAbandon)
		if !strings.Contains(ab.Err.Error(), "confirm timeout "+timeout.String()) {
			t.Fatalf("abandonment after the reset: %v, want confirm timeout %v in it", ab.Err, timeout)
		}
		if st := p.Stats(); st.AbandonStreak != 1 || st.ConfirmTimeoutNow < 2*timeout {
			t.Fatalf("after the first abandonment of a new stall: stats %+v, want streak 1, ConfirmTimeoutNow ≥ %v", st, 2*timeout)
		}
		stall.Store(false)
		select {
		case err := <-second:
			if err != nil {
				t.Fatalf("second Publish: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("second Publish still waiting 20 s after the broker confirms again; stats %+v", p.Stats())
		}
		t.Logf("backed-off waits %v (ConfirmTimeout %v, cap %v); after the reset, abandoned %v into a new stall; stats %+v",
			waited, timeout, 4*timeout, ab.Time.Sub(start).Round(time.Millisecond), p.Stats())
	})
}

// MaxConfirmTimeout at ConfirmTimeout turns the backoff off: every
// abandonment of a stall that lasts comes after ConfirmTimeout.
func TestConfirmTimeoutBackoffOff(t *testing.T) {
	script := brokerScript{decide: func(published) action { return silent },
		heartbeat: 200 * time.Millisecond}
	const timeout = 100 * time.Millisecond
	var abandons atomic.Int64
	three := make(chan struct{})
	p := newPublisher(t, PublisherOptions{
		Dial: peerPerDial(t, compat.Drainer, script), ConfirmTimeout: timeout, MaxConfirmTimeout: timeout,
		Backoff: Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond},
		OnEvent: func(e Event) {
			if e.Kind == EventAbandon && abandons.Add(1) == 3 {
				close(three)
			}
		},
	})
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("x")}) }()
	select {
	case <-three:
	case <-time.After(20 * time.Second):
		t.Fatalf("fewer than 3 abandonments in 20 s; stats %+v", p.Stats())
	}
	if st := p.Stats(); st.ConfirmTimeoutNow != timeout || st.AbandonStreak < 3 {
		t.Fatalf("stats %+v, want ConfirmTimeoutNow %v and a streak of at least 3", st, timeout)
	}
	cancel()
	<-done
}

// peerPerDial dials a new fake broker running script at each call: a
// fakepeer serves one connection per Serve, and the publisher redials an
// unknown number of times. The caller closes the publisher before the
// test ends (a defer runs before the peers' cleanups), so that it does
// not dial during them.
func peerPerDial(t *testing.T, mode compat.Mode, script brokerScript) DialFunc {
	return func(ctx context.Context) (*amqp.Connection, error) {
		peer := fakepeer.Listen(t, fakepeer.WithHeartbeat(1))
		peer.Serve(script.run)
		return compat.Dial(peer.URL(), mode)
	}
}
