package legacyread_test

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	"github.com/amqp091-drainer/amqp091-drainer/legacyread"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func dial(t *testing.T, url string, cfg amqp.Config) *amqp.Connection {
	t.Helper()
	if url == "" {
		url = testenv.AMQPURL(t)
	}
	conn, err := legacyread.DialConfig(url, cfg, legacyread.Options{})
	if err != nil {
		t.Fatalf("dial in legacy mode: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if got := conn.ReadMode(); got != "legacy" {
		t.Fatalf("ReadMode() = %q, want legacy", got)
	}
	return conn
}

// settledGoroutines waits for the goroutine count to hold still.
func settledGoroutines() int {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	prev := runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		<-tick.C
		n := runtime.NumGoroutine()
		if n == prev {
			return n
		}
		prev = n
	}
	return prev
}

// TestIdleConnectionHasNoGoroutines: 10 idle legacy connections with a
// channel each add no goroutine at all.
func TestIdleConnectionHasNoGoroutines(t *testing.T) {
	before := settledGoroutines()
	for i := 0; i < 10; i++ {
		testenv.Channel(t, dial(t, "", amqp.Config{}))
	}
	if after := settledGoroutines(); after != before {
		t.Fatalf("10 idle legacy connections added %d goroutines, want 0", after-before)
	}
}

// TestRPCsPumpTheirOwnReplies: concurrent RPC callers on separate channels,
// with nobody else reading, all get their replies.
func TestRPCsPumpTheirOwnReplies(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		ch := testenv.Channel(t, conn)
		q := testenv.ExclusiveQueue(t, ch)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				if _, err := ch.QueueDeclarePassive(q, false, true, true, false, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestConfirmWaitReadsFrames: publish-and-wait works with no other
// goroutine reading.
func TestConfirmWaitReadsFrames(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	ch := testenv.Channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	q := testenv.ExclusiveQueue(t, ch)
	for i := 0; i < 20; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if !dc.Wait() {
				t.Fatalf("publish %d nacked", i)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !ok {
			t.Fatalf("publish %d: WaitContext = %v, %v", i, ok, err)
		}
	}
}

// TestConsumerNeedsADrainLoop: deliveries arrive only while someone drains.
func TestConsumerNeedsADrainLoop(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	ch := testenv.Channel(t, conn)
	q := testenv.ExclusiveQueue(t, ch)
	deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-deliveries:
		t.Fatalf("a delivery (%q) arrived although nobody drained", d.Body)
	case <-time.After(300 * time.Millisecond): // nothing reads: nothing can arrive
	}
	if d := drainUntilDelivery(t, conn, deliveries); string(d.Body) != "hello" {
		t.Fatalf("delivery %q, want hello", d.Body)
	}
}

// drainUntilDelivery runs a drain loop until a delivery arrives. A
// dispatched delivery reaches the chan through the consumer's buffer
// goroutine, a moment after DrainEvents returns.
func drainUntilDelivery(t *testing.T, conn *amqp.Connection, deliveries <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := conn.DrainEvents(ctx)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("DrainEvents: %v", err)
		}
		select {
		case d := <-deliveries:
			return d
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("no delivery within 10s of draining")
	return amqp.Delivery{}
}

// TestDrainEventsKeepsPartialFrames: the peer sends a delivery in two
// halves with a pause between; DrainEvents with a short ctx times out in
// the middle, and the next call completes the frame from what was kept.
func TestDrainEventsKeepsPartialFrames(t *testing.T) {
	body := []byte("a body that arrives in two halves")
	peer := fakepeer.Listen(t)
	release := make(chan struct{})
	peer.Serve(func(s *fakepeer.Session) error {
		ch, tag, err := s.AnswerChannelAndConsume()
		if err != nil {
			return err
		}
		frames := fakepeer.BasicDeliver(ch, tag, 1, false, "", "q", body, s.FrameMax())
		half := len(frames) / 2
		if err := s.Send(frames[:half]); err != nil {
			return err
		}
		select {
		case <-release:
		case <-s.Done():
			return nil
		}
		if err := s.Send(frames[half:]); err != nil {
			return err
		}
		return s.AnswerClose()
	})
	conn := dial(t, peer.URL(), amqp.Config{})
	ch := testenv.Channel(t, conn)
	deliveries, err := ch.Consume("q", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err = conn.DrainEvents(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DrainEvents with half a delivery buffered = %v, want context.DeadlineExceeded", err)
	}
	close(release)
	if d := drainUntilDelivery(t, conn, deliveries); string(d.Body) != string(body) {
		t.Fatalf("delivery %q, want %q", d.Body, body)
	}
}

// TestPublishWaitsBehindABlockingDrain is the legacy behaviour the
// benchmarks measure: while a goroutine sits in DrainEvents(1 s) on an idle
// connection, a publish waits for the transport lock.
func TestPublishWaitsBehindABlockingDrain(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	ch := testenv.Channel(t, conn)
	q := testenv.ExclusiveQueue(t, ch)
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.DrainEvents(ctx)
			cancel()
		}
	}()
	// Publish for 2.5 s: whenever the drainer sits in its read, the
	// publish waits for it.
	var slowest time.Duration
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); {
		start := time.Now()
		if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > slowest {
			slowest = d
		}
	}
	close(stop)
	<-drained
	t.Logf("slowest publish behind a blocking DrainEvents(1s): %s", slowest)
	if slowest < 100*time.Millisecond {
		t.Fatalf("publishes never waited behind the blocking read (slowest %s): the transport lock is not shared", slowest)
	}
}

// TestIdleConnectionIsNotKeptAlive: with heartbeat 1 s and nobody calling
// in, the broker drops the connection; the next call finds out.
func TestIdleConnectionIsNotKeptAlive(t *testing.T) {
	conn := dial(t, "", amqp.Config{Heartbeat: time.Second})
	ch := testenv.Channel(t, conn)
	<-time.After(5 * time.Second) // the idle period is the scenario
	_, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err == nil {
		t.Fatal("an RPC succeeded on a connection that sent no heartbeat for 5 s")
	}
	t.Logf("the next call after 5 s idle: %v", err)
}

// TestCloseWithActiveDrainAndPublisher: 50 trials of Close with a DrainEvents
// loop and a publisher running; every Close returns within its bound and
// the drain loop sees ErrClosedIntentionally.
func TestCloseWithActiveDrainAndPublisher(t *testing.T) {
	const trials = 50
	var times []time.Duration
	for i := 0; i < trials; i++ {
		conn, err := legacyread.Dial(testenv.AMQPURL(t), legacyread.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ch := testenv.Channel(t, conn)
		q := testenv.ExclusiveQueue(t, ch)
		var wg sync.WaitGroup
		drainErr := make(chan error, 1)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				err := conn.DrainEvents(ctx)
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					drainErr <- err
					return
				}
			}
		}()
		published := make(chan struct{}, 1)
		go func() {
			defer wg.Done()
			for {
				if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
					return
				}
				select {
				case published <- struct{}{}:
				default:
				}
			}
		}()
		<-published
		start := time.Now()
		err = conn.Close()
		d := time.Since(start)
		times = append(times, d)
		if err != nil && !errors.Is(err, amqp.ErrClosed) {
			t.Fatalf("trial %d: Close = %v", i, err)
		}
		if d > 7*time.Second {
			t.Fatalf("trial %d: Close took %s", i, d)
		}
		if err := <-drainErr; !errors.Is(err, amqp.ErrClosedIntentionally) {
			t.Fatalf("trial %d: the drain loop ended with %v, want ErrClosedIntentionally", i, err)
		}
		wg.Wait()
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	t.Logf("%d closes with an active drain loop and publisher: P50 %s, P95 %s, max %s",
		trials, times[trials/2], times[trials*95/100], times[trials-1])
}

// TestResetIsFoundOnTheNextTurn: after the broker side is reset, every
// waiter gets an error when its turn comes.
func TestResetIsFoundOnTheNextTurn(t *testing.T) {
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets() // a real TCP RST, not an orderly close
	conn := dial(t, proxy.URL(), amqp.Config{})
	ch := testenv.Channel(t, conn)
	q := testenv.ExclusiveQueue(t, ch)
	proxy.ResetPeer(toxi.Upstream, 0)
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := ch.QueueDeclarePassive(q, false, true, true, false, nil); err != nil {
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("RPC callers were not all released after the reset")
	}
}

// TestDrainLoopKeepsTheConnectionAlive: the same idle connection as above
// stays up while the application calls in: a drain loop sends heartbeats.
func TestDrainLoopKeepsTheConnectionAlive(t *testing.T) {
	conn := dial(t, "", amqp.Config{Heartbeat: time.Second})
	ch := testenv.Channel(t, conn)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := conn.DrainEvents(ctx)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("DrainEvents: %v", err)
		}
	}
	if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatalf("an RPC after 5 s of draining: %v", err)
	}
}

// TestChannelErrorEndsTheCallAtOnce: a caller whose own read dispatched
// its channel's close returns that error without reading on. (It used to
// take the transport lock again half of the time and read until the next
// frame, which a broker that waits for the client never sends.) 32 rounds
// make a coin flip per round certain to show.
func TestChannelErrorEndsTheCallAtOnce(t *testing.T) {
	const rounds = 32
	peer := fakepeer.Listen(t)
	peer.Serve(func(s *fakepeer.Session) error {
		for i := 0; i < rounds; i++ {
			ch, err := s.AnswerChannelOpen()
			if err != nil {
				return err
			}
			if _, err := s.ExpectMethod(ch, 50, 10); err != nil { // queue.declare
				return err
			}
			if err := s.Send(fakepeer.ChannelClose(ch, 406, "PRECONDITION_FAILED - inequivalent arg", 50, 10)); err != nil {
				return err
			}
			if _, err := s.ExpectMethod(ch, 20, 41); err != nil { // channel.close-ok
				return err
			}
		}
		return nil
	})
	conn := dial(t, peer.URL(), amqp.Config{})
	for i := 0; i < rounds; i++ {
		ch := testenv.Channel(t, conn)
		errc := make(chan error, 1)
		go func() {
			_, err := ch.QueueDeclare("q", true, false, false, false, nil)
			errc <- err
		}()
		select {
		case err := <-errc:
			var amqpErr *amqp.Error
			if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed {
				t.Fatalf("round %d: QueueDeclare = %v, want the channel's 406", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: QueueDeclare still waiting 10s after its channel was closed", i)
		}
	}
}

// TestSilenceWhileNobodyReadsIsNotAHeartbeatTimeout: the heartbeat check
// counts the broker's silence only while someone reads. A connection left
// alone for three heartbeat periods (the peer here sends no heartbeats,
// and nothing reads them in legacy mode anyway) still serves the next RPC.
// The blackhole case, silence while a drain loop reads, is a cell of
// reliability/faultmatrix.
func TestSilenceWhileNobodyReadsIsNotAHeartbeatTimeout(t *testing.T) {
	peer := fakepeer.Listen(t, fakepeer.WithHeartbeat(1))
	peer.Serve(func(s *fakepeer.Session) error {
		ch, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		if _, err := s.ExpectMethod(ch, 50, 10); err != nil { // queue.declare
			return err
		}
		if err := s.Send(fakepeer.QueueDeclareOk(ch, "q", 0, 0)); err != nil {
			return err
		}
		return s.AnswerClose()
	})
	conn := dial(t, peer.URL(), amqp.Config{Heartbeat: time.Second})
	ch := testenv.Channel(t, conn)
	// The idle period is what is under test, not a synchronisation.
	<-time.After(3 * time.Second)
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatalf("QueueDeclare after an idle period: %v", err)
	}
}

// TestCancelEndsABlockedDrain: cancelling a DrainEvents ctx that has no
// deadline ends a read on a silent connection, whether the cancellation
// comes while the read has not yet hooked it (its first millisecond) or
// after. Either way DrainEvents returns context.Canceled well inside the
// bound; the phases only vary which path the read takes.
func TestCancelEndsABlockedDrain(t *testing.T) {
	peer := fakepeer.Listen(t)
	peer.Serve(func(s *fakepeer.Session) error {
		<-s.Done()
		return nil
	})
	conn := dial(t, peer.URL(), amqp.Config{})
	for _, after := range []time.Duration{0, 200 * time.Microsecond, 50 * time.Millisecond} {
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(after, cancel)
		start := time.Now()
		err := conn.DrainEvents(ctx)
		took := time.Since(start)
		timer.Stop()
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancel after %s: DrainEvents = %v, want context.Canceled", after, err)
		}
		if took > after+5*time.Second {
			t.Fatalf("cancel after %s: DrainEvents returned after %s", after, took)
		}
	}
}
