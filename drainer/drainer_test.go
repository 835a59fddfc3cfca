package drainer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// blockingReads runs this package's tests over drainer.BlockingDialer's sockets, set by
// AMQP091_DRAINER_TEST_BLOCKING_READ=1: scripts/test runs the package so a second time.
var blockingReads = os.Getenv("AMQP091_DRAINER_TEST_BLOCKING_READ") == "1"

// drainerDial is drainer.DialConfig, through drainer.BlockingDialer when blockingReads.
func drainerDial(url string, cfg amqp.Config, opts drainer.Options) (*amqp.Connection, error) {
	if blockingReads {
		cfg.Dial = drainer.BlockingDialer(cfg.Dial, 0)
	}
	return drainer.DialConfig(url, cfg, opts)
}

// dial opens a drainer-mode connection to url (the test broker by default),
// closed when the test ends.
func dial(t *testing.T, url string, cfg amqp.Config) *amqp.Connection {
	t.Helper()
	if url == "" {
		url = testenv.AMQPURL(t)
	}
	conn, err := drainerDial(url, cfg, drainer.Options{})
	if err != nil {
		t.Fatalf("dial in drainer mode: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if got := conn.ReadMode(); got != "drainer" {
		t.Fatalf("ReadMode() = %q, want drainer", got)
	}
	return conn
}

// opTimer runs operations and keeps the slowest.
type opTimer struct {
	n       int
	slowest time.Duration
	what    string
}

func (o *opTimer) run(t *testing.T, what string, op func() error) {
	t.Helper()
	start := time.Now()
	if err := op(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	o.n++
	if d := time.Since(start); d > o.slowest {
		o.slowest, o.what = d, what
	}
}

// busyChannelB runs 200 QueueDeclare RPCs and 200 publish+confirm round
// trips on a second channel of conn, and fails the test if any one takes
// more than a second.
func busyChannelB(t *testing.T, conn *amqp.Connection) {
	t.Helper()
	ctx := context.Background()
	chB := testenv.Channel(t, conn)
	if err := chB.Confirm(false); err != nil {
		t.Fatalf("Confirm on B: %v", err)
	}
	qB := testenv.ExclusiveQueue(t, chB)
	var ops opTimer
	for i := 0; i < 200; i++ {
		ops.run(t, "QueueDeclare on B", func() error {
			_, err := chB.QueueDeclarePassive(qB, false, true, true, false, nil)
			return err
		})
		ops.run(t, "publish+confirm on B", func() error {
			dc, err := chB.PublishWithDeferredConfirmWithContext(ctx, "", qB, false, false, amqp.Publishing{Body: []byte("b")})
			if err != nil {
				return err
			}
			ok, err := dc.WaitContext(ctx)
			if err == nil && !ok {
				err = errors.New("nacked")
			}
			return err
		})
	}
	t.Logf("channel B: %d operations, slowest %s (%s)", ops.n, ops.slowest, ops.what)
	if ops.slowest > time.Second {
		t.Fatalf("channel B's slowest operation took %s (%s), want under 1s", ops.slowest, ops.what)
	}
}

// TestUnreadPublishListenerStallsNobody is upstream's measured failure: an
// unread NotifyPublish listener on channel A. Upstream stalls every channel
// for 5 s per confirmation, drops them, then kills its own connection.
func TestUnreadPublishListenerStallsNobody(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	chA := testenv.Channel(t, conn)
	if err := chA.Confirm(false); err != nil {
		t.Fatalf("Confirm on A: %v", err)
	}
	confirms := chA.NotifyPublish(make(chan amqp.Confirmation, 1))
	qA := testenv.ExclusiveQueue(t, chA)
	const n = 200
	for i := 0; i < n; i++ {
		if err := chA.PublishWithContext(context.Background(), "", qA, false, false, amqp.Publishing{Body: []byte("a")}); err != nil {
			t.Fatalf("publish %d on A: %v", i, err)
		}
	}

	busyChannelB(t, conn)
	if conn.IsClosed() {
		t.Fatal("the connection closed while A's listener was unread")
	}

	for want := uint64(1); want <= n; want++ {
		select {
		case c := <-confirms:
			if c.DeliveryTag != want || !c.Ack {
				t.Fatalf("confirmation %d = %+v, want tag %d acked, in order", want, c, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("confirmation %d of %d never arrived", want, n)
		}
	}
}

// TestUnreadReturnListenerStallsNobody: 200 mandatory publishes to a queue
// that does not exist, with A's NotifyReturn listener unread.
func TestUnreadReturnListenerStallsNobody(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	chA := testenv.Channel(t, conn)
	returns := chA.NotifyReturn(make(chan amqp.Return, 1))
	const n = 200
	for i := 0; i < n; i++ {
		msg := amqp.Publishing{MessageId: fmt.Sprint(i), Body: []byte("r")}
		if err := chA.PublishWithContext(context.Background(), "", "drainer-test-no-such-queue", true, false, msg); err != nil {
			t.Fatalf("publish %d on A: %v", i, err)
		}
	}

	busyChannelB(t, conn)
	if conn.IsClosed() {
		t.Fatal("the connection closed while A's listener was unread")
	}

	for i := 0; i < n; i++ {
		select {
		case r := <-returns:
			if r.MessageId != fmt.Sprint(i) {
				t.Fatalf("return %d carries message %q: out of order", i, r.MessageId)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("return %d of %d never arrived", i, n)
		}
	}
}

// TestUnreadCancelListenerStallsNobody: the queue under A's consumer is
// deleted, so the broker sends basic.cancel to an unread NotifyCancel
// listener.
func TestUnreadCancelListenerStallsNobody(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	chA := testenv.Channel(t, conn)
	cancels := chA.NotifyCancel(make(chan string)) // unbuffered and unread
	q := testenv.ExclusiveQueue(t, chA)
	deliveries, err := chA.Consume(q, "drainer-test-consumer", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if _, err := testenv.Channel(t, conn).QueueDelete(q, false, false, false); err != nil {
		t.Fatalf("QueueDelete: %v", err)
	}

	busyChannelB(t, conn)
	select {
	case tag := <-cancels:
		if tag != "drainer-test-consumer" {
			t.Fatalf("cancel for %q, want drainer-test-consumer", tag)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancel notification never arrived")
	}
	select {
	case _, open := <-deliveries:
		if open {
			t.Fatal("a delivery arrived from a deleted queue")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled consumer's delivery chan was not closed")
	}
}

func TestDrainEvents(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := conn.DrainEvents(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DrainEvents on an idle connection = %v, want context.DeadlineExceeded", err)
	}

	ch := testenv.Channel(t, conn)
	q := testenv.ExclusiveQueue(t, ch)
	drained := make(chan error, 1)
	go func() { drained <- conn.DrainEvents(context.Background()) }()
	if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclarePassive(q, false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("DrainEvents after a reply = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("DrainEvents did not return after a frame was dispatched")
	}

	go func() { drained <- conn.DrainEvents(context.Background()) }()
	if err := conn.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-drained:
		if !errors.Is(err, amqp.ErrClosedIntentionally) || !errors.Is(err, amqp.ErrClosed) {
			t.Fatalf("DrainEvents across Close = %v, want ErrClosedIntentionally (an ErrClosed)", err)
		}
		var rec interface{ Recoverable() bool }
		if !errors.As(err, &rec) || rec.Recoverable() {
			t.Fatalf("%v must not be Recoverable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake DrainEvents")
	}
}

// TestIdlePublishOnlyConnectionStaysAlive: with heartbeat 1 s and nothing to
// read but heartbeats, the drainer keeps the connection up for 10 s.
func TestIdlePublishOnlyConnectionStaysAlive(t *testing.T) {
	conn := dial(t, "", amqp.Config{Heartbeat: time.Second})
	ch := testenv.Channel(t, conn)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	select {
	case err := <-closed:
		t.Fatalf("the idle connection closed: %v", err)
	case <-time.After(10 * time.Second): // the idle period is the scenario
	}
	if err := ch.PublishWithContext(context.Background(), "", "", false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatalf("publish after 10 s idle: %v", err)
	}
}

// TestBlackholeIsDetected: once the broker's bytes stop arriving, the
// connection is declared dead within three heartbeat intervals of the last
// frame read. The clock starts before the toxic is installed, and a heartbeat
// may still pass while Toxiproxy installs it, so the bound allows one more
// interval (a CI run measured 3.004 s).
func TestBlackholeIsDetected(t *testing.T) {
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets() // a real TCP RST, not an orderly close
	conn := dial(t, proxy.URL(), amqp.Config{Heartbeat: time.Second})
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	start := time.Now()
	proxy.Timeout(toxi.Downstream, 0)
	select {
	case err := <-closed:
		elapsed := time.Since(start)
		t.Logf("blackhole detected after %s: %v", elapsed, err)
		if elapsed > 4*time.Second {
			t.Fatalf("detected after %s, want within 3 heartbeat intervals of the last frame (4s bound)", elapsed)
		}
		if err == nil || err.Code != amqp.FrameError {
			t.Fatalf("close error = %v, want a FrameError (501)", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the blackholed connection was never declared dead")
	}
}

// TestOneGoroutinePerIdleConnection counts goroutines: each idle drainer
// connection costs exactly one, which both reads and sends heartbeats.
func TestOneGoroutinePerIdleConnection(t *testing.T) {
	settle := func() int {
		// Transient goroutines end on their own: outboxes once empty,
		// channel dispatchers a second after their last frame (they park
		// for the next burst). Poll until the count holds still for two
		// seconds.
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(15 * time.Second)
		prev, still := runtime.NumGoroutine(), 0
		for time.Now().Before(deadline) {
			<-tick.C
			n := runtime.NumGoroutine()
			if n != prev {
				prev, still = n, 0
				continue
			}
			if still++; still == 20 {
				return n
			}
		}
		return prev
	}
	before := settle()
	const n = 20
	for i := 0; i < n; i++ {
		testenv.Channel(t, dial(t, "", amqp.Config{Heartbeat: time.Second}))
	}
	after := settle()
	if per := float64(after-before) / n; per != 1 {
		t.Fatalf("%d idle connections added %d goroutines (%.2f each), want exactly 1 each", n, after-before, per)
	}
}

// TestResetReleasesEveryWaiter: 60 goroutines wait on one connection in six
// different ways when the broker's side is reset; all are released,
// each with an error (or, for consumers, a closed delivery chan), within a
// second of each other.
func TestResetReleasesEveryWaiter(t *testing.T) {
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets() // a real TCP RST, not an orderly close
	conn := dial(t, proxy.URL(), amqp.Config{})
	const each = 10

	var wg sync.WaitGroup
	released := make(chan time.Time, 6*each)
	start := func(what string, wait func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := wait()
			at := time.Now()
			if err == nil {
				t.Errorf("%s: released without an error", what)
			}
			released <- at
		}()
	}

	for i := 0; i < each; i++ {
		ch := testenv.Channel(t, conn)
		q := testenv.ExclusiveQueue(t, ch)
		deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		start("consumer", func() error {
			for range deliveries {
			}
			return errors.New("deliveries closed")
		})
		chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
		start("channel NotifyClose", func() error {
			if err, ok := <-chClosed; ok && err != nil {
				return err
			}
			return errors.New("closed without an error value")
		})
		connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
		start("connection NotifyClose", func() error {
			if err, ok := <-connClosed; ok && err != nil {
				return err
			}
			return errors.New("closed without an error value")
		})
	}
	// Workers that keep the connection busy until it fails: publishers
	// with confirms, RPC callers and DrainEvents loops. Their own traffic
	// triggers the reset once the toxic is in place.
	for i := 0; i < each; i++ {
		pubCh := testenv.Channel(t, conn)
		if err := pubCh.Confirm(false); err != nil {
			t.Fatal(err)
		}
		q := testenv.ExclusiveQueue(t, pubCh)
		start("publisher with confirms", func() error {
			for {
				dc, err := pubCh.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{})
				if err != nil {
					return err
				}
				if !dc.Wait() {
					return errors.New("nacked")
				}
			}
		})
		rpcCh := testenv.Channel(t, conn)
		start("RPC caller", func() error {
			for {
				if _, err := rpcCh.QueueDeclarePassive(q, false, true, true, false, nil); err != nil {
					return err
				}
			}
		})
		start("DrainEvents loop", func() error {
			for {
				if err := conn.DrainEvents(context.Background()); err != nil {
					return err
				}
			}
		})
	}
	proxy.ResetPeer(toxi.Upstream, 0)

	var first, last time.Time
	for i := 0; i < 6*each; i++ {
		select {
		case at := <-released:
			if first.IsZero() || at.Before(first) {
				first = at
			}
			if at.After(last) {
				last = at
			}
		case <-time.After(15 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("only %d of %d waiters were released\n%s", i, 6*each, buf[:runtime.Stack(buf, true)])
		}
	}
	wg.Wait()
	t.Logf("all %d waiters released within %s of each other", 6*each, last.Sub(first))
	if last.Sub(first) > time.Second {
		t.Fatalf("the last waiter was released %s after the first, want within 1s", last.Sub(first))
	}
}

func brokerURL(t *testing.T) string { return testenv.AMQPURL(t) }

// TestUnreadCloseListenerStallsNobody: the broker closes channel A (a
// passive declare of a missing queue) while A's NotifyClose listener goes
// unread; channel B carries on, and A's listener holds the error for when
// it is read. The listener has room for the one value, as upstream
// requires: a NotifyClose listener without room gets nothing, in every
// mode (see the package doc).
func TestUnreadCloseListenerStallsNobody(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	chA := testenv.Channel(t, conn)
	closed := chA.NotifyClose(make(chan *amqp.Error, 1))
	_, err := chA.QueueDeclarePassive("drainer-test-no-such-queue", false, false, false, false, nil)
	var amqpErr *amqp.Error
	if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.NotFound {
		t.Fatalf("passive declare of a missing queue = %v, want 404", err)
	}

	busyChannelB(t, conn)
	if conn.IsClosed() {
		t.Fatal("the connection closed with channel A")
	}
	select {
	case err := <-closed:
		if err == nil || err.Code != amqp.NotFound {
			t.Fatalf("A's NotifyClose = %v, want the 404", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A's close notification never arrived")
	}
}

// TestRecoveryKeepsDrainerMode: with upstream's automatic recovery on, a
// reset connection comes back, still in drainer mode, with its channel
// usable, and the intentional Close at the end is not mistaken for a
// failure to recover from.
func TestRecoveryKeepsDrainerMode(t *testing.T) {
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets() // a real TCP RST, not an orderly close
	conn := dial(t, proxy.URL(), amqp.Config{Recovery: &amqp.Recovery{
		ReconnectionConfig: &amqp.ReconnectionConfig{MaxRetryCount: 20, RetryInterval: 200 * time.Millisecond},
	}})
	states := make(chan *amqp.StateChanged, 16)
	conn.NotifyStateChange(states)
	ch := testenv.Channel(t, conn)

	toxic := proxy.ResetPeer(toxi.Upstream, 0)
	_ = ch.PublishWithContext(context.Background(), "", "", false, false, amqp.Publishing{}) // triggers the reset
	waitState := func(want amqp.LifeCycleState) {
		t.Helper()
		for {
			select {
			case s := <-states:
				if s.To == want {
					return
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("the connection never reached state %v", want)
			}
		}
	}
	waitState(amqp.StateReconnecting)
	proxy.RemoveToxic(toxic)
	waitState(amqp.StateOpen)

	if got := conn.ReadMode(); got != "drainer" {
		t.Fatalf("ReadMode() after recovery = %q, want drainer", got)
	}
	q := testenv.ExclusiveQueue(t, ch)
	if _, err := ch.QueueDeclarePassive(q, false, true, true, false, nil); err != nil {
		t.Fatalf("an RPC on the recovered channel: %v", err)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("Close after recovery: %v", err)
	}
	if conn.IsRecoveryEnabled() {
		t.Fatal("recovery is still enabled after an intentional Close")
	}
}
