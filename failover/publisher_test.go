package failover

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	amqp "github.com/rabbitmq/amqp091-go"
)

func newPublisher(t *testing.T, o PublisherOptions) *Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := NewPublisher(ctx, o)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func idMsg(queue string) func(i int) (string, amqp.Publishing) {
	return func(i int) (string, amqp.Publishing) {
		id := fmt.Sprintf("m-%d", i)
		return queue, amqp.Publishing{MessageId: id, Body: []byte(id)}
	}
}

func TestPublishConfirmed(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		queue, ch := durableQueue(t)
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, testenv.AMQPURL(t)), MaxOutstanding: 100})
		const n = 1000
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		if err := firstErr(publishAll(ctx, p, n, 16, idMsg(queue))); err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(start)
		st := p.Stats()
		if st.Confirmed != n || st.Outstanding != 0 || st.Published != n {
			t.Fatalf("stats %+v, want %d confirmed and published", st, n)
		}
		cstart := time.Now()
		if err := p.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		t.Logf("Close took %v", time.Since(cstart))
		got := drainQueue(t, ch, queue)
		for i := 0; i < n; i++ {
			if got[fmt.Sprintf("m-%d", i)] != 1 {
				t.Fatalf("m-%d is in the queue %d times", i, got[fmt.Sprintf("m-%d", i)])
			}
		}
		t.Logf("%d confirmed in %v (%.0f msg/s)", n, elapsed.Round(time.Millisecond), n/elapsed.Seconds())
	})
}

func TestAssignsMessageID(t *testing.T) {
	queue, ch := durableQueue(t)
	p := newPublisher(t, PublisherOptions{Dial: cycleDial(compat.Upstream, testenv.AMQPURL(t))})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		if err := p.Publish(ctx, "", queue, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	got := drainQueue(t, ch, queue)
	if len(got) != 3 {
		t.Fatalf("want 3 distinct MessageIds, got %v", got)
	}
	for id := range got {
		if id == "" {
			t.Fatalf("empty MessageId in %v", got)
		}
	}
}

// A broker that never confirms: Publish blocks at MaxOutstanding, a ctx
// ends the wait, and Close is bounded although the broker answers neither
// confirms nor connection.close.
func TestMaxOutstandingAndCloseWhileStalled(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		peer := fakepeer.Listen(t)
		peer.Serve(brokerScript{decide: func(published) action { return silent }, ignoreClose: true}.run)
		const max = 5
		const closeTimeout = 500 * time.Millisecond
		p, err := NewPublisher(context.Background(), PublisherOptions{
			Dial: cycleDial(mode, peer.URL()), MaxOutstanding: max, CloseTimeout: closeTimeout,
		})
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, max)
		for i := 0; i < max; i++ {
			go func() { errs <- p.Publish(context.Background(), "", "q", false, amqp.Publishing{Body: []byte("x")}) }()
		}
		deadline := time.Now().Add(5 * time.Second)
		for p.Stats().Published < max && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if st := p.Stats(); st.Published != max || st.Outstanding != max {
			t.Fatalf("stats %+v, want %d published and outstanding", st, max)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		err = p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("x")})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 150*time.Millisecond {
			t.Fatalf("publish over the limit: %v after %v, want DeadlineExceeded after 200ms", err, time.Since(start))
		}
		start = time.Now()
		cerr := p.Close()
		took := time.Since(start)
		// Drainer and legacy modes wait for close-ok up to their own close
		// timeout whatever CloseDeadline says: Close reports that it left
		// the close running.
		if cerr != nil && mode == compat.Upstream {
			t.Fatalf("Close: %v", cerr)
		}
		waitGoroutines(t, p)
		if took > closeTimeout+300*time.Millisecond {
			t.Fatalf("Close took %v, CloseTimeout %v", took, closeTimeout)
		}
		for i := 0; i < max; i++ {
			if err := <-errs; !errors.Is(err, amqp.ErrClosed) {
				t.Fatalf("pending publish: %v, want ErrClosed", err)
			}
		}
		if err := p.Publish(context.Background(), "", "q", false, amqp.Publishing{}); !errors.Is(err, amqp.ErrClosed) {
			t.Fatalf("publish after Close: %v", err)
		}
		t.Logf("Close with stalled confirms and no close-ok took %v (error: %v)", took.Round(time.Millisecond), cerr)
	})
}

// The peer nacks everything on the first channel, as RabbitMQ does on a
// channel first used during a quorum-queue leader election.
func TestNackStormReopensChannel(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		peer := fakepeer.Listen(t)
		peer.Serve(brokerScript{decide: func(m published) action {
			if m.chIndex == 0 {
				return nack
			}
			return ack
		}}.run)
		var log eventLog
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, peer.URL()), OnEvent: log.add,
			Backoff: Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := firstErr(publishAll(ctx, p, 200, 8, idMsg("q"))); err != nil {
			t.Fatal(err)
		}
		st := p.Stats()
		if log.count(EventChannelReopen) != int(st.ChannelReopens) || log.count(EventNack) != int(st.Nacks) {
			t.Fatalf("events disagree with stats %+v", st)
		}
		if st.ChannelReopens < 1 || st.Nacks < 1 || st.Confirmed != 200 || st.Failovers != 0 {
			t.Fatalf("stats %+v: want ≥ 1 reopen, ≥ 1 nack, 200 confirmed, no failover", st)
		}
		t.Logf("stats %+v", st)
	})
}

// The peer nacks everything on its first five channels, as RabbitMQ
// does on every channel opened while a leader election runs. The first
// reopen republishes everything unconfirmed; the reopens after it, with
// nothing confirmed in between, are a storm: each of their channels
// carries one message (a probe) until the broker acks one, and the sixth
// channel, whose probe is acked, carries everything else. Within
// MaxConfirmTimeout of the storm's start a probe's nack is not charged:
// with MaxAttempts 3, the message nacked on the first two channels and
// probed on the next three is still confirmed.
func TestNackStormProbes(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		const stormChannels, n = 5, 100
		var mu sync.Mutex
		carried := map[int]int{} // messages published, by channel index
		peer := fakepeer.Listen(t)
		peer.Serve(brokerScript{decide: func(m published) action {
			mu.Lock()
			carried[m.chIndex]++
			mu.Unlock()
			if m.chIndex < stormChannels {
				return nack
			}
			return ack
		}}.run)
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, peer.URL()), MaxAttempts: 3,
			ConfirmTimeout: 10 * time.Second, // a storm grace of 40 s
			Backoff:        Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := firstErr(publishAll(ctx, p, n, 32, idMsg("q"))); err != nil {
			t.Fatal(err)
		}
		st := p.Stats()
		mu.Lock()
		defer mu.Unlock()
		t.Logf("messages carried by channel index: %v; stats %+v", carried, st)
		if st.Confirmed != n || st.Failed != 0 || st.ChannelReopens != stormChannels || st.Failovers != 0 {
			t.Fatalf("stats %+v: want %d confirmed, none failed, %d reopens, no failover", st, n, stormChannels)
		}
		for i := 2; i < stormChannels; i++ {
			if carried[i] != 1 {
				t.Fatalf("storm channel %d carried %d messages, want 1 (a probe)", i, carried[i])
			}
		}
		if carried[stormChannels] != n {
			t.Fatalf("channel %d, whose probe was acked, carried %d messages, want all %d", stormChannels, carried[stormChannels], n)
		}
	})
}

// A storm that outlasts MaxConfirmTimeout is the broker refusing the
// message: its probes' nacks are charged again, and MaxAttempts ends it.
func TestNackStormPastGraceFails(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		peer := fakepeer.Listen(t)
		peer.Serve(brokerScript{decide: func(published) action { return nack }}.run)
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, peer.URL()), MaxAttempts: 3,
			ConfirmTimeout: 200 * time.Millisecond, // a storm grace of 800 ms
			Backoff:        Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		err := p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("x")})
		took := time.Since(start)
		if !errors.Is(err, ErrNacked) {
			t.Fatalf("Publish: %v, want ErrNacked", err)
		}
		st := p.Stats()
		if st.Failed != 1 || st.Published <= 3 || took < 800*time.Millisecond {
			t.Fatalf("stats %+v after %v: want 1 failed, more than MaxAttempts (3) published, at least the grace (800 ms)", st, took)
		}
		t.Logf("failed after %v and %d publishes, %d of them free probes: %v", took.Round(time.Millisecond), st.Published, st.Published-3, err)
	})
}

func TestNackedForever(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		peer := fakepeer.Listen(t)
		peer.Serve(brokerScript{decide: func(published) action { return nack }}.run)
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, peer.URL()), MaxAttempts: 3,
			Backoff: Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("x")})
		if !errors.Is(err, ErrNacked) {
			t.Fatalf("Publish: %v, want ErrNacked", err)
		}
		if st := p.Stats(); st.Published != 3 || st.Nacks != 3 || st.Failed != 1 || st.Outstanding != 0 {
			t.Fatalf("stats %+v, want 3 published and nacked, 1 failed", st)
		}
		t.Logf("error: %v", err)
	})
}

// The first endpoint accepts publishes and heartbeats but never confirms,
// as a node cut off from its cluster does; the second confirms.
func TestConfirmTimeoutAbandons(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		stalled := fakepeer.Listen(t, fakepeer.WithHeartbeat(1))
		stalled.Serve(brokerScript{decide: func(published) action { return silent },
			heartbeat: 200 * time.Millisecond, ignoreClose: true}.run)
		good := fakepeer.Listen(t)
		good.Serve(brokerScript{decide: func(published) action { return ack }}.run)
		const timeout = 300 * time.Millisecond
		var log eventLog
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, stalled.URL(), good.URL()),
			ConfirmTimeout: timeout, OnEvent: log.add})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		if err := firstErr(publishAll(ctx, p, 50, 5, idMsg("q"))); err != nil {
			t.Fatal(err)
		}
		done := time.Since(start)
		st := p.Stats()
		if st.Abandons != 1 || st.Failovers != 1 || st.Confirmed != 50 {
			t.Fatalf("stats %+v, want 1 abandon, 1 failover, 50 confirmed", st)
		}
		ab, _ := log.first(EventAbandon)
		if d := ab.Time.Sub(start); d > timeout+time.Second {
			t.Fatalf("abandoned %v after the first publish, ConfirmTimeout %v", d, timeout)
		}
		var closeLatency time.Duration
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if e, ok := log.first(EventAbandoned); ok {
				closeLatency = e.Latency
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("abandon %v after the first publish (ConfirmTimeout %v), CloseDeadline(now) took %v, all 50 confirmed on the second endpoint %v after the first publish",
			ab.Time.Sub(start).Round(time.Millisecond), timeout, closeLatency, done.Round(time.Millisecond))
	})
}

// Tags restart at 1 on every channel: an ack of the old channel's tag 1,
// arriving after the reopen, must not settle the message that got tag 1 on
// the new channel. (Upstream delivers confirmations of a channel in tag
// order, so the peer confirms in order too.)
func TestOldChannelTagsSettleNothing(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		var mu sync.Mutex
		var oldChannel uint16
		strayAcked := make(chan struct{})
		peer := fakepeer.Listen(t)
		peer.Serve(brokerScript{
			decide: func(m published) action {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case m.chIndex == 0:
					oldChannel = m.channel
					return nack // X on the first channel: retire it
				case m.tag == 1:
					return silent // X on the new channel: held
				}
				return ackMultiple
			},
			onClose: func(channel uint16, send func(...[]byte) error) {
				mu.Lock()
				defer mu.Unlock()
				if channel == oldChannel {
					// A stray ack of the old channel's tag 1, before its
					// close-ok: the new channel's tag 1 is X too.
					_ = send(fakepeer.BasicAck(channel, 1, false))
					close(strayAcked)
				}
			},
		}.run)
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, peer.URL())})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		xDone := make(chan error, 1)
		go func() { xDone <- p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("X")}) }()
		select {
		case <-strayAcked:
		case <-time.After(5 * time.Second):
			t.Fatal("the old channel was not closed")
		}
		select {
		case err := <-xDone:
			t.Fatalf("X settled (%v) by the old channel's ack", err)
		case <-time.After(300 * time.Millisecond):
		}
		if st := p.Stats(); st.Confirmed != 0 || st.ChannelReopens != 1 || st.Published != 2 {
			t.Fatalf("stats %+v, want 0 confirmed, 1 reopen, 2 published", st)
		}
		// Y gets tag 2 on the new channel; its ack is multiple, so it
		// confirms X (tag 1) too.
		yDone := make(chan error, 1)
		go func() { yDone <- p.Publish(ctx, "", "q", false, amqp.Publishing{Body: []byte("Y")}) }()
		if err := <-yDone; err != nil {
			t.Fatalf("Y: %v", err)
		}
		if err := <-xDone; err != nil {
			t.Fatalf("X: %v", err)
		}
		if st := p.Stats(); st.Confirmed != 2 || st.Nacks != 1 {
			t.Fatalf("stats %+v, want 2 confirmed, 1 nack", st)
		}
	})
}

// A connection reset mid-stream: every Publish returns nil, and every
// confirmed message is in the queue.
func TestConnectionLossRepublishes(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		queue, ch := durableQueue(t)
		p1 := toxi.NewProxy(t, testenv.AMQPAddr(t))
		p2 := toxi.NewProxy(t, testenv.AMQPAddr(t))
		var log eventLog
		p := newPublisher(t, PublisherOptions{Dial: cycleDial(mode, p1.URL(), p2.URL()), MaxOutstanding: 200,
			OnEvent: log.add, Backoff: Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}})
		const n = 3000
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		pubStart := time.Now()
		result := make(chan []error, 1)
		go func() { result <- publishAll(ctx, p, n, 16, idMsg(queue)) }()
		for p.Stats().Confirmed < n/4 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cutAt := time.Now()
		p1.Disable() // closes every connection through it
		errs := <-result
		t.Logf("publishAll took %v", time.Since(pubStart))
		p1.Enable()
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
		st := p.Stats()
		if st.Failovers < 1 || st.Confirmed != n {
			t.Fatalf("stats %+v, want ≥ 1 failover, %d confirmed", st, n)
		}
		got := drainQueue(t, ch, queue)
		dups := 0
		for i := 0; i < n; i++ {
			c := got[fmt.Sprintf("m-%d", i)]
			if c == 0 {
				t.Fatalf("confirmed m-%d is not in the queue", i)
			}
			dups += c - 1
		}
		var resumed time.Duration
		if e, ok := log.first(EventConnected); ok {
			_ = e
		}
		log.mu.Lock()
		for _, e := range log.events {
			if e.Kind == EventConnected && e.Time.After(cutAt) {
				resumed = e.Time.Sub(cutAt)
				break
			}
		}
		log.mu.Unlock()
		t.Logf("stats %+v; %d duplicates in the queue; new channel ready %v after the cut", st, dups, resumed.Round(time.Millisecond))
	})
}

// CloseDeadline with a deadline of now must return at once in every read
// mode, even against a peer that reads nothing and answers nothing: the
// abandonment relies on it.
func TestCloseDeadlineNowIsImmediate(t *testing.T) {
	for _, mode := range []compat.Mode{compat.Upstream, compat.Drainer, compat.Legacy, compat.LegacyAutoDrain} {
		t.Run(mode.String(), func(t *testing.T) {
			peer := fakepeer.Listen(t)
			stopped := make(chan struct{}) // the peer no longer reads
			peer.Serve(func(s *fakepeer.Session) error {
				if _, err := s.AnswerChannelOpen(); err != nil {
					return err
				}
				if err := s.StopReading(); err != nil {
					return err
				}
				close(stopped)
				<-s.Done()
				return nil
			})
			conn, err := compat.Dial(peer.URL(), mode)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Channel(); err != nil {
				t.Fatal(err)
			}
			// Closed before the peer stopped reading, the socket would
			// fail the peer's StopReading instead.
			<-stopped
			took := abandon(conn)
			if took > 200*time.Millisecond {
				t.Fatalf("CloseDeadline(now) took %v", took)
			}
			if !conn.IsClosed() {
				t.Fatal("connection not closed")
			}
			t.Logf("CloseDeadline(now) took %v", took)
		})
	}
}

// waitGoroutines waits for what a Close left running in the background.
func waitGoroutines(t *testing.T, p *Publisher) {
	t.Helper()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the publisher's goroutines did not end 15 s after Close")
	}
}

// Close is bounded even while the manager sits in a DialFunc that ignores
// its ctx.
func TestCloseBoundedDuringStuckDial(t *testing.T) {
	peer := fakepeer.Listen(t)
	peer.Serve(func(s *fakepeer.Session) error {
		ch, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		if _, err := s.ExpectMethod(ch, 85, 10); err != nil {
			return err
		}
		if err := s.Send(fakepeer.ConfirmSelectOk(ch)); err != nil {
			return err
		}
		return s.Close() // the node goes away
	})
	dialing := make(chan struct{})
	dialed := make(chan struct{})
	var calls int
	dial := func(ctx context.Context) (*amqp.Connection, error) {
		calls++
		if calls == 1 {
			return compat.Dial(peer.URL(), compat.Upstream)
		}
		if calls == 2 {
			close(dialing)
			defer close(dialed)
		}
		time.Sleep(time.Second) // ignores ctx
		return nil, errors.New("unreachable")
	}
	p, err := NewPublisher(context.Background(), PublisherOptions{Dial: dial, CloseTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pending := make(chan error, 1)
	go func() { pending <- p.Publish(context.Background(), "", "q", false, amqp.Publishing{}) }()
	<-dialing
	start := time.Now()
	cerr := p.Close()
	took := time.Since(start)
	if cerr == nil || took > 400*time.Millisecond {
		t.Fatalf("Close: %v after %v, want an error within 200ms", cerr, took)
	}
	if err := <-pending; !errors.Is(err, amqp.ErrClosed) {
		t.Fatalf("pending Publish: %v, want ErrClosed", err)
	}
	<-dialed
	<-p.done
	waitGoroutines(t, p)
	t.Logf("Close took %v: %v", took.Round(time.Millisecond), cerr)
}
