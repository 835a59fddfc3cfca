package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/backoff"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DialFunc opens a new connection. The failover package calls it for the
// first connection and after every loss or abandonment, and closes what it
// returns. It should move on to another node on each call (round robin or
// shuffle over the cluster's endpoints), so that a node just abandoned is not
// the first one retried. The connection must not have amqp.Config.Recovery
// set: the package recovers by itself and refuses such a connection.
type DialFunc func(ctx context.Context) (*amqp.Connection, error)

// Backoff paces retries: Initial after the first failure in a row,
// doubling up to Max, each less up to 20% at random (jitter). The zero
// value means 50ms and 5s; a Max below Initial is Initial. Each kind of
// failure counts on its own: failed dials (counted afresh after each lost
// connection; a Publisher whose channel setup failed on a new connection
// waits Initial before dialling again), a Consumer's failed setups (until
// one succeeds) and its broker cancels (until a delivery), and a
// Publisher's channel reopens with no confirmation between them (capped in
// a nack storm; see the package doc).
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

// withDefaults fills in the fields left at zero, as Backoff's doc says.
func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = 50 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 5 * time.Second
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	return b
}

// delay returns the wait after n ≥ 1 failures in a row (dials, channel
// reopens or broker cancels): the shared exponential of internal/backoff,
// with a fifth of jitter rather than compat.DialCluster's full jitter, so
// that a wait stays close to the bound that the docs and the tests of
// reopenDelay reason about.
func (b Backoff) delay(n int) time.Duration {
	return backoff.Exponential{Initial: b.Initial, Max: b.Max, Jitter: backoff.Fifth}.Delay(n)
}

// EventKind names what an Event reports.
type EventKind int

// The events. OnEvent receives them synchronously from the package's own
// goroutines: it must return quickly and must not call back into the
// Publisher or Consumer.
const (
	EventConnected      EventKind = iota + 1 // a connection and its channel are ready (also after a channel reopen)
	EventDialFailed                          // DialFunc failed (Err)
	EventConnectionLost                      // the connection or a write on it failed (Err); a failover follows
	EventNack                                // the broker nacked a message (MessageID)
	EventChannelReopen                       // a new channel replaces one on the same connection (after a nack, a channel close or a silent probe)
	EventRepublish                           // unconfirmed messages go out again on a new channel (Count)
	EventAbandon                             // the oldest unconfirmed message exceeded ConfirmTimeout: the connection is abandoned
	EventAbandoned                           // the abandoned connection's CloseDeadline returned (Latency: how long it took)
	EventFailed                              // a message gave up after MaxAttempts (MessageID, Err)
	EventConsuming                           // the consumer's basic.consume succeeded
	EventRedelivered                         // the consumer got a delivery with Redelivered set (MessageID)
	EventCancelled                           // the broker cancelled the consumer (basic.cancel: its queue deleted, a consumer timeout); it consumes again after a backoff (Count: consecutive cancels)
)

var kindNames = map[EventKind]string{
	EventConnected: "connected", EventDialFailed: "dial-failed", EventConnectionLost: "connection-lost",
	EventNack: "nack", EventChannelReopen: "channel-reopen", EventRepublish: "republish",
	EventAbandon: "abandon", EventAbandoned: "abandoned", EventFailed: "failed",
	EventConsuming: "consuming", EventRedelivered: "redelivered", EventCancelled: "cancelled",
}

func (k EventKind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one thing that happened, timestamped, for tests and benchmarks.
type Event struct {
	Kind      EventKind
	Time      time.Time
	Err       error
	MessageID string
	Count     int           // EventRepublish: messages republished; EventCancelled: broker cancels in a row
	Latency   time.Duration // EventAbandoned: duration of CloseDeadline
}

// Errors. Every error a Publish returns wraps one of these, or the caller's
// ctx.Err().
var (
	// ErrNacked: the broker nacked the message on its last allowed attempt.
	ErrNacked = errors.New("failover: message nacked by the broker")
	// ErrGaveUp: the message went out MaxAttempts times, and the last
	// attempt was lost with its connection or channel, or abandoned.
	ErrGaveUp = errors.New("failover: message not confirmed after the maximum number of attempts")
	// ErrRecoveryEnabled: DialFunc returned a connection with
	// amqp.Config.Recovery set.
	ErrRecoveryEnabled = errors.New("failover: DialFunc returned a connection with amqp.Config.Recovery set; the failover package recovers by itself")
)

// errClosed is what pending and later calls get after Close; errors.Is(err,
// amqp.ErrClosed) holds.
var errClosed = fmt.Errorf("failover: publisher closed: %w", amqp.ErrClosed)

type notifier struct {
	log     *slog.Logger
	onEvent func(Event)
}

func newNotifier(l *slog.Logger, f func(Event)) notifier {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return notifier{log: l, onEvent: f}
}

func (n notifier) emit(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if n.onEvent != nil {
		n.onEvent(e)
	}
}

// dialLoop calls dial until it returns a usable connection or ctx ends.
func dialLoop(ctx context.Context, dial DialFunc, b Backoff, n notifier) (*amqp.Connection, error) {
	for failures := 0; ; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		conn, err := dial(ctx)
		if err == nil && conn != nil && ctx.Err() != nil {
			abandon(conn) // a DialFunc that ignored ctx
			return nil, ctx.Err()
		}
		if err == nil && conn == nil {
			err = errors.New("failover: DialFunc returned no connection and no error")
		}
		if err == nil && conn.IsRecoveryEnabled() {
			abandon(conn)
			err = ErrRecoveryEnabled
		}
		if err == nil {
			return conn, nil
		}
		failures++
		n.log.Warn("failover: dial failed", "err", err, "failures", failures)
		n.emit(Event{Kind: EventDialFailed, Err: err})
		t := time.NewTimer(b.delay(failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// abandon drops conn without waiting for the broker: the socket deadline
// is now, so connection.close cannot be written or answered, and the
// connection shuts down at once (the tests measure it in every read mode).
func abandon(conn *amqp.Connection) time.Duration {
	return closeConn(conn, nil, time.Now())
}

// closeConn closes conn, waiting for close-ok until deadline at most (a
// deadline of now abandons it), with its drain loop held off: in plain
// legacy mode, CloseDeadline with a DrainEvents caller in a read waits for
// the deadline even when close-ok arrives at once (measured: 4.95 s of a
// 5 s deadline against a local broker, 1 ms with the loop held off).
func closeConn(conn *amqp.Connection, d *drainLoop, deadline time.Time) time.Duration {
	start := time.Now()
	release := d.holdOut()
	_ = conn.CloseDeadline(deadline)
	release()
	return time.Since(start)
}

// drainLoop reads a plain legacy connection, where nothing is read unless
// someone calls DrainEvents. It runs for the life of its connection.
//
// Legacy mode holds one transport lock across a read and every write, so a
// drain loop sitting in a read would hold up writes until a frame arrives.
// Writers therefore go through hold, which cuts the loop's read short (its
// ctx is cancelled) and keeps it out until they are done.
type drainLoop struct {
	conn  *amqp.Connection
	ended chan *amqp.Error // NotifyClose of conn
	done  chan struct{}

	mu      sync.Mutex
	writers int
	idle    chan struct{} // closed when writers drops to 0
	cancel  context.CancelFunc
	out     chan struct{} // closed when the current DrainEvents returns
}

// startDrainLoop starts the loop if conn needs one (ReadMode "legacy"), and
// returns nil otherwise; a nil *drainLoop's hold does nothing.
func startDrainLoop(conn *amqp.Connection, wg *sync.WaitGroup) *drainLoop {
	if conn.ReadMode() != "legacy" {
		return nil
	}
	d := &drainLoop{
		conn:  conn,
		ended: conn.NotifyClose(make(chan *amqp.Error, 1)),
		done:  make(chan struct{}),
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(d.done)
		d.run()
	}()
	return d
}

func (d *drainLoop) run() {
	for {
		d.mu.Lock()
		if d.writers > 0 {
			idle := d.idle
			d.mu.Unlock()
			select {
			case <-idle:
			case <-d.ended:
				return
			}
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		d.cancel = cancel
		out := make(chan struct{})
		d.out = out
		d.mu.Unlock()
		err := d.conn.DrainEvents(ctx)
		cancel()
		d.mu.Lock()
		d.cancel, d.out = nil, nil
		close(out)
		d.mu.Unlock()
		if err != nil && !errors.Is(err, context.Canceled) {
			return // the connection ended
		}
	}
}

// holdOut is hold that also waits, briefly, for the loop to be out of
// its read: CloseDeadline sets the socket's deadline, which would undo the
// interruption of a read still in progress.
func (d *drainLoop) holdOut() (release func()) {
	release = d.hold()
	if d == nil {
		return release
	}
	d.mu.Lock()
	out := d.out
	d.mu.Unlock()
	if out != nil {
		t := time.NewTimer(200 * time.Millisecond)
		defer t.Stop()
		select {
		case <-out:
		case <-d.done:
		case <-t.C:
		}
	}
	return release
}

// hold keeps the drain loop out of the socket until the returned release
// is called; use it around every write and RPC on a legacy connection.
func (d *drainLoop) hold() (release func()) {
	if d == nil {
		return func() {}
	}
	d.mu.Lock()
	if d.writers == 0 {
		d.idle = make(chan struct{})
	}
	d.writers++
	if d.cancel != nil {
		d.cancel()
	}
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		d.writers--
		if d.writers == 0 {
			close(d.idle)
		}
		d.mu.Unlock()
	}
}
