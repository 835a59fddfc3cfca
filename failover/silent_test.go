package failover

import (
	"container/list"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The watchdog's two checks, driven by a fake clock: each takes the
// moment to judge, so the times below are made up, and no channel or
// connection is needed.
func TestSilentProbeRule(t *testing.T) {
	const timeout = 2 * time.Second
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	newRule := func() *Publisher {
		p := &Publisher{o: PublisherOptions{ConfirmTimeout: timeout}.withDefaults(), n: newNotifier(nil, nil)}
		p.stats.ConfirmTimeoutNow = timeout
		return p
	}
	// channel holds one message in flight, put there at sentAt, waiting on
	// its connection since waitingSince.
	channel := func(probe probeKind, sentAt, waitingSince time.Time) *chanGen {
		g := &chanGen{probe: probe, order: list.New()}
		m := &message{sentAt: sentAt, waitingSince: waitingSince}
		m.oelem = g.order.PushBack(m)
		return g
	}

	t.Run("a probe unanswered for an eighth of ConfirmTimeout is reopened", func(t *testing.T) {
		p := newRule()
		g := channel(probeCharged, t0, t0)
		if err := p.silentProbe(g, t0.Add(timeout/8-time.Millisecond)); err != nil {
			t.Fatalf("reopened before an eighth of ConfirmTimeout: %v", err)
		}
		err := p.silentProbe(g, t0.Add(timeout/8))
		if err == nil || !strings.Contains(err.Error(), "unanswered for 250ms") {
			t.Fatalf("at an eighth of ConfirmTimeout: %v, want a silent probe of 250ms", err)
		}
		if st := p.Stats(); st.SilentReopens != 1 {
			t.Fatalf("SilentReopens %d, want 1", st.SilentReopens)
		}
	})

	t.Run("a channel that is not a probe is left to the confirm timeout", func(t *testing.T) {
		p := newRule()
		g := channel(noProbe, t0, t0)
		if err := p.silentProbe(g, t0.Add(timeout-time.Millisecond)); err != nil {
			t.Fatalf("a steady channel was reopened for silence: %v", err)
		}
		if err := p.overdue(g, t0.Add(timeout)); err == nil {
			t.Fatal("not abandoned at ConfirmTimeout")
		}
	})

	t.Run("an empty probe channel is not silent", func(t *testing.T) {
		p := newRule()
		g := &chanGen{probe: probeFree, order: list.New()}
		if err := p.silentProbe(g, t0.Add(time.Hour)); err != nil {
			t.Fatalf("a channel with nothing in flight was reopened: %v", err)
		}
	})

	t.Run("reopens that stay silent still end at the confirm timeout", func(t *testing.T) {
		p := newRule()
		// The message went out first at t0 on this connection; three
		// silent reopens later it is on its fourth channel, put there
		// 100 ms ago.
		now := t0.Add(timeout)
		g := channel(probeFree, now.Add(-100*time.Millisecond), t0)
		if err := p.silentProbe(g, now); err != nil {
			t.Fatalf("a fresh probe channel was reopened: %v", err)
		}
		if err := p.overdue(g, now); err == nil {
			t.Fatal("not abandoned ConfirmTimeout after the first publish on the connection")
		}
		if st := p.Stats(); st.Abandons != 1 || st.ConfirmTimeoutNow != 2*timeout {
			t.Fatalf("stats %+v: want 1 abandonment and the timeout backed off to %v", st, 2*timeout)
		}
	})

	t.Run("a node that answered a silent probe's reopen waits MaxConfirmTimeout", func(t *testing.T) {
		p := newRule()
		g := channel(probeFree, t0, t0)
		p.nodeAnswered()
		limit := p.o.MaxConfirmTimeout
		if limit <= timeout {
			t.Fatalf("MaxConfirmTimeout %v by default, want above ConfirmTimeout %v", limit, timeout)
		}
		if err := p.overdue(g, t0.Add(limit-time.Millisecond)); err != nil {
			t.Fatalf("a live node's silence abandoned before MaxConfirmTimeout: %v", err)
		}
		if st := p.Stats(); st.ConfirmTimeoutNow != limit {
			t.Fatalf("ConfirmTimeoutNow %v, want MaxConfirmTimeout %v", st.ConfirmTimeoutNow, limit)
		}
		if err := p.overdue(g, t0.Add(limit)); err == nil {
			t.Fatal("a live node's silence not abandoned at MaxConfirmTimeout")
		}
	})

	t.Run("the watchdog ticks often enough to reopen within a quarter", func(t *testing.T) {
		p := newRule()
		if period := p.silentAfter(); 2*period > timeout/4 {
			t.Fatalf("silence %v plus a tick of at most %v exceeds a quarter of ConfirmTimeout", period, period)
		}
	})
}

// A silent retire charges no attempt and keeps the confirm timeout's
// start on the same connection; on another connection it starts again.
func TestSilentRetireKeepsTheWait(t *testing.T) {
	p := &Publisher{o: PublisherOptions{MaxAttempts: 2}.withDefaults(), n: newNotifier(nil, nil),
		queue: list.New(), slots: make(chan struct{}, 1)}
	p.slots <- struct{}{}
	p.stats.Outstanding = 1
	cg := &connGen{}
	t0 := time.Now().Add(-time.Minute)
	g := &chanGen{cg: cg, probe: probeCharged, order: list.New(), inflight: map[uint64]*message{},
		failed: make(chan struct{})}
	m := &message{attempts: 2, gen: g, tag: 1, sentAt: t0, waitingSince: t0, waitConn: cg, done: make(chan error, 1)}
	m.oelem = g.order.PushBack(m)
	g.inflight[1] = m
	if n := p.retireLocked(g, errors.New("silent"), true); n != 1 || m.settled {
		t.Fatalf("retired %d, settled %v: want the message requeued, not failed at MaxAttempts", n, m.settled)
	}
	if m.attempts != 1 || !m.keepWaiting {
		t.Fatalf("attempts %d, keepWaiting %v: want the silent attempt refunded and the wait kept", m.attempts, m.keepWaiting)
	}
}

// The first endpoint never confirms, so the watchdog abandons it. The
// second answers everything but confirms nothing on its first three
// channels, as a healthy node does on channels opened while its peers
// still counted a frozen node as the queue's leader: the probe of each is
// reopened on the same connection, and the fourth channel confirms. One
// failover, not two.
func TestSilentProbeReopensOnTheSameConnection(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		const silentChannels = 3
		stalled := fakepeer.Listen(t)
		stalled.Serve(brokerScript{decide: func(published) action { return silent }, ignoreClose: true}.run)
		healthy := fakepeer.Listen(t)
		healthy.Serve(brokerScript{decide: func(m published) action {
			if m.chIndex < silentChannels {
				return silent
			}
			return ack
		}, keepSilentChannels: true}.run)
		const timeout = 800 * time.Millisecond
		var log eventLog
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, stalled.URL(), healthy.URL()),
			ConfirmTimeout: timeout, MaxAttempts: 2, OnEvent: log.add})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := firstErr(publishAll(ctx, p, 50, 5, idMsg("q"))); err != nil {
			t.Fatal(err)
		}
		st := p.Stats()
		t.Logf("stats %+v", st)
		if st.Failovers != 1 || st.Abandons != 1 || st.Confirmed != 50 || st.Failed != 0 {
			t.Fatalf("stats %+v: want 1 failover, 1 abandonment, 50 confirmed, none failed", st)
		}
		if st.SilentReopens < silentChannels || st.ChannelReopens < silentChannels {
			t.Fatalf("stats %+v: want at least %d silent reopens", st, silentChannels)
		}
	})
}

// When reopened channels stay silent on a node that answers, the confirm
// timeout (backed off after the first abandonment) still abandons it; the
// silent reopens spend no attempt, so nothing fails with MaxAttempts 3.
func TestSilentReopensEndInAnAbandonment(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		stalled := fakepeer.Listen(t)
		stalled.Serve(brokerScript{decide: func(published) action { return silent }, ignoreClose: true}.run)
		answering := fakepeer.Listen(t) // answers channel.open, confirms nothing
		answering.Serve(brokerScript{decide: func(published) action { return silent }, ignoreClose: true}.run)
		good := fakepeer.Listen(t)
		good.Serve(brokerScript{decide: func(published) action { return ack }}.run)
		const timeout = 400 * time.Millisecond
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, stalled.URL(), answering.URL(), good.URL()),
			ConfirmTimeout: timeout, MaxAttempts: 3})
		st := publishOnce(t, p)
		if st.Abandons != 2 || st.Failovers != 2 || st.Confirmed != 1 || st.SilentReopens < 1 {
			t.Fatalf("stats %+v: want 2 abandonments, 2 failovers, ≥ 1 silent reopen, 1 confirmed", st)
		}
	})
}

// The second endpoint freezes after its first channel: it leaves the
// reopen's channel.open unanswered, so the node is gone, not its queue
// unready, and the publisher fails over within a quarter of
// ConfirmTimeout instead of waiting out the backed-off confirm timeout.
func TestSilentProbeOnAFrozenNodeFailsOver(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		stalled := fakepeer.Listen(t)
		stalled.Serve(brokerScript{decide: func(published) action { return silent }, ignoreClose: true}.run)
		frozen := fakepeer.Listen(t)
		frozen.Serve(brokerScript{decide: func(published) action { return silent }, frozenFrom: 1, ignoreClose: true}.run)
		good := fakepeer.Listen(t)
		good.Serve(brokerScript{decide: func(published) action { return ack }}.run)
		const timeout = 2 * time.Second
		var log eventLog
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, stalled.URL(), frozen.URL(), good.URL()),
			ConfirmTimeout: timeout, OnEvent: log.add})
		st := publishOnce(t, p)
		if st.Abandons != 1 || st.Failovers != 2 || st.SilentReopens != 1 || st.Confirmed != 1 {
			t.Fatalf("stats %+v: want 1 abandonment (the first node), 2 failovers, 1 silent reopen, 1 confirmed", st)
		}
		if st.ConfirmTimeoutNow != timeout {
			t.Fatalf("confirm timeout now %v: the ack should have reset it to %v", st.ConfirmTimeoutNow, timeout)
		}
	})
}

// publishOnce publishes one message, bounded generously, and returns the
// publisher's stats once the broker confirmed it.
func publishOnce(t *testing.T, p *Publisher) PublisherStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	t.Logf("stats %+v", st)
	return st
}
