package faultmatrix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
)

const (
	// callBound is the stated bound: every call a cell makes (a publish,
	// a confirmation wait, an ack, an RPC, a receive, DrainEvents, Close)
	// returns within it, and a fault that breaks the connection is
	// noticed within it. With a 1 s heartbeat a blackhole is noticed in
	// about 3 s, and Close gives up on close-ok after closeTimeout.
	callBound = 10 * time.Second
	// heartbeat is what the cells negotiate: short, so that a silent
	// connection is found out quickly.
	heartbeat = time.Second
	// closeTimeout bounds Close in drainer and legacy modes.
	closeTimeout = 3 * time.Second
	// ctxSlack lets a call that ignores its context overrun the bound
	// visibly rather than be cut short by the context.
	ctxSlack = 5 * time.Second
)

// errNotConfirmed stands for a publish the broker did not ack: a nack, or
// a confirmation settled negatively because the connection ended.
var errNotConfirmed = errors.New("publish not confirmed")

// kind classifies an error for the "right kind" check.
func kind(err error) string {
	var amqpErr *amqp.Error
	var netErr net.Error
	switch {
	case err == nil:
		return "none"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "context"
	case errors.Is(err, amqp.ErrClosedIntentionally):
		return "intentional"
	case errors.Is(err, errNotConfirmed):
		return "not-confirmed"
	case errors.As(err, &amqpErr):
		return "amqp"
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return "net"
	default:
		return "other"
	}
}

// call is one timed call a cell made.
type call struct {
	what string
	took time.Duration
	err  error
}

// recorder collects a cell's calls from its goroutines.
type recorder struct {
	mu       sync.Mutex
	calls    []call
	ok       int // successful calls
	okAfter  int // successful calls after the fault was injected
	injected bool
	progress chan struct{} // closed at the first successful call
}

func newRecorder() *recorder { return &recorder{progress: make(chan struct{})} }

func (r *recorder) record(what string, start time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{what: what, took: time.Since(start), err: err})
	if err == nil {
		if r.ok == 0 {
			close(r.progress)
		}
		r.ok++
		if r.injected {
			r.okAfter++
		}
	}
}

func (r *recorder) inject() {
	r.mu.Lock()
	r.injected = true
	r.mu.Unlock()
}

func (r *recorder) snapshot() (calls []call, okAfter int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls...), r.okAfter
}

// env is what a phase's activity works with.
type env struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	admin *amqp.Channel // on a direct connection, untouched by the fault
	queue string
	rec   *recorder

	deliveries <-chan amqp.Delivery // the consuming phase's consumer
}

// A phase is a moment in a connection's life during which the fault
// strikes. setup runs before the fault and may fail the cell; run is the
// activity, which returns when ctx ends or a call fails.
type phase struct {
	name  string
	setup func(e *env) error
	run   func(ctx context.Context, e *env)
}

var body = []byte(strings.Repeat("m", 256))

// phases are the five phases of the matrix. "close" has no activity: the
// cell injects the fault and then closes.
var phases = []phase{
	{name: "idle"},
	{name: "publishing", setup: func(e *env) error { return e.ch.Confirm(false) }, run: publishing},
	{name: "consuming", setup: startConsuming, run: consuming},
	{name: "rpc", run: rpcs},
	{name: "close"},
}

// publishing publishes with confirms, one message at a time, waiting for
// each confirmation.
func publishing(ctx context.Context, e *env) {
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(context.Background(), callBound+ctxSlack)
		start := time.Now()
		dc, err := e.ch.PublishWithDeferredConfirmWithContext(cctx, "", e.queue, false, false,
			amqp.Publishing{Body: body})
		e.rec.record("publish", start, err)
		if err != nil {
			cancel()
			return
		}
		start = time.Now()
		acked, err := dc.WaitContext(cctx)
		cancel()
		if err == nil && !acked {
			err = errNotConfirmed
		}
		e.rec.record("confirm", start, err)
		if err != nil {
			return
		}
	}
}

func startConsuming(e *env) error {
	if err := e.ch.Qos(10, 0, false); err != nil {
		return err
	}
	d, err := e.ch.Consume(e.queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	e.deliveries = d
	return nil
}

// consuming receives and acks; a feeder on the direct connection keeps
// messages coming. A receive is a call too: under a fault that breaks the
// connection, the deliveries channel must close within the bound.
func consuming(ctx context.Context, e *env) {
	for {
		start := time.Now()
		select {
		case d, ok := <-e.deliveries:
			if !ok {
				e.rec.record("receive", start, amqp.ErrClosed)
				return
			}
			e.rec.record("receive", start, nil)
			start = time.Now()
			err := d.Ack(false)
			e.rec.record("ack", start, err)
			if err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// rpcs makes one RPC after another.
func rpcs(ctx context.Context, e *env) {
	for ctx.Err() == nil {
		start := time.Now()
		_, err := e.ch.QueueDeclarePassive(e.queue, false, false, false, false, nil)
		e.rec.record("rpc", start, err)
		if err != nil {
			return
		}
	}
}

// feed publishes into queue from the direct connection until ctx ends, so
// that the consuming phase has a steady flow.
func feed(ctx context.Context, admin *amqp.Channel, queue string) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := admin.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: body}); err != nil {
				return
			}
		}
	}
}

// verdict is a cell's outcome.
type verdict struct {
	pass  bool
	worst time.Duration
	why   []string
}

func (v *verdict) failf(format string, args ...any) {
	v.pass = false
	v.why = append(v.why, fmt.Sprintf(format, args...))
}

// waitWithin waits for done, up to d, and reports whether it came.
func waitWithin(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// runCell runs one cell and returns its verdict. admin is a channel on a
// direct connection; window is how long a fault the connection survives
// is left acting before the cell checks progress and closes.
func runCell(t *testing.T, mode compat.Mode, f fault, p phase, admin *amqp.Channel, window time.Duration) verdict {
	v := verdict{pass: true}
	leakBaseline := goleak.IgnoreCurrent()

	q, err := admin.QueueDeclare("", false, false, false, false, amqp.Table{"x-expires": int32(60000)})
	if err != nil {
		t.Fatalf("declare the cell's queue: %v", err)
	}
	defer func() { _, _ = admin.QueueDelete(q.Name, false, false, false) }()

	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()
	cfg := amqp.Config{Heartbeat: heartbeat, Locale: "en_US"}
	conn, err := compat.DialConfig(proxy.URL(), cfg, mode,
		compat.WithDrainerOptions(amqp.DrainerOptions{CloseTimeout: closeTimeout}),
		compat.WithLegacyOptions(amqp.LegacyOptions{CloseTimeout: closeTimeout}))
	if err != nil {
		t.Fatalf("dial through the proxy: %v", err)
	}
	rec := newRecorder()
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))

	// In legacy mode nothing reads unless someone calls in: the cell runs
	// the drain loop an application would.
	drained := make(chan struct{})
	if mode == compat.Legacy {
		go func() {
			defer close(drained)
			for {
				// Only the last call is recorded: the one the break or
				// Close ends, timed from its own start.
				start := time.Now()
				if err := conn.DrainEvents(context.Background()); err != nil {
					rec.record("DrainEvents", start, err)
					return
				}
			}
		}()
	} else {
		close(drained)
	}

	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		t.Fatalf("open a channel: %v", err)
	}
	e := &env{conn: conn, ch: ch, admin: admin, queue: q.Name, rec: rec}
	if p.setup != nil {
		if err := p.setup(e); err != nil {
			_ = conn.Close()
			t.Fatalf("%s setup: %v", p.name, err)
		}
	}
	feedCtx, stopFeed := context.WithCancel(context.Background())
	fed := make(chan struct{})
	if p.name == "consuming" {
		go func() { defer close(fed); feed(feedCtx, admin, q.Name) }()
	} else {
		close(fed)
	}
	defer func() { stopFeed(); <-fed }()

	actCtx, stopActivity := context.WithCancel(context.Background())
	defer stopActivity()
	active := make(chan struct{})
	if p.run != nil {
		go func() { defer close(active); p.run(actCtx, e) }()
		if !waitWithin(rec.progress, callBound) {
			v.failf("no progress before the fault")
		}
	} else {
		close(active)
	}

	// unstick ends every socket through the proxy, so that a cell that
	// overran its bound does not leave goroutines to the next one.
	unstuck := false
	unstick := func() {
		if !unstuck {
			unstuck = true
			proxy.Disable()
		}
	}

	injectedAt := time.Now()
	rec.inject()
	f.inject(proxy)

	if p.name != "close" {
		if f.breaks {
			select {
			case err := <-closes:
				rec.record("notice", injectedAt, nil)
				if err == nil {
					v.failf("NotifyClose closed without an error")
				}
			case <-time.After(callBound):
				v.failf("the broken connection was not noticed within %s", callBound)
			}
			// The activity's calls must now fail on their own.
			if !waitWithin(active, callBound) {
				v.failf("the activity's calls did not return within %s of the fault", callBound)
				unstick()
				<-active
			}
		} else {
			select {
			case err := <-closes:
				v.failf("the connection closed under a fault it should survive: %v", err)
			case <-time.After(window):
			}
			if p.run == nil {
				start := time.Now()
				_, err := ch.QueueDeclarePassive(q.Name, false, false, false, false, nil)
				rec.record("rpc", start, err)
			}
			stopActivity()
			if !waitWithin(active, callBound) {
				v.failf("the activity's calls did not return within %s", callBound)
				unstick()
				<-active
			}
		}
	}

	closed := make(chan struct{})
	start := time.Now()
	var closeErr error
	go func() { defer close(closed); closeErr = conn.Close() }()
	if !waitWithin(closed, callBound) {
		v.failf("Close did not return within %s", callBound)
		unstick()
		<-closed
	}
	rec.record("Close", start, closeErr)
	if !conn.IsClosed() {
		v.failf("IsClosed is false after Close")
	}
	if !waitWithin(drained, callBound) {
		v.failf("DrainEvents did not return within %s of Close", callBound)
		unstick()
		<-drained
	}
	stopFeed()
	<-fed

	calls, okAfter := rec.snapshot()
	for _, c := range calls {
		if c.took > v.worst {
			v.worst = c.took
		}
		if c.took > callBound {
			v.failf("%s took %s, over the %s bound", c.what, c.took.Round(time.Millisecond), callBound)
		}
		if !rightKind(f, p, c) {
			v.failf("%s: wrong kind of error (%s): %v", c.what, kind(c.err), c.err)
		}
	}
	if !f.breaks && p.name != "close" && okAfter == 0 {
		v.failf("no call succeeded while the fault acted")
	}

	// Goroutines: ours must be gone. The toxiproxy client's idle HTTP
	// connections are not ours.
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	if err := goleak.Find(leakBaseline); err != nil {
		v.failf("goroutines left behind: %v", err)
	}
	sort.Strings(v.why)
	return v
}

// rightKind says whether c's error is what the fault and phase allow.
func rightKind(f fault, p phase, c call) bool {
	k := kind(c.err)
	switch {
	case k == "none":
		return true
	case c.what == "DrainEvents":
		// The drain loop ends at the break, or at our Close.
		return k == "intentional" || (f.breaks && (k == "amqp" || k == "net"))
	case c.what == "Close":
		// Closing a connection that already broke reports that it broke.
		return f.breaks && (k == "amqp" || k == "net")
	case !f.breaks:
		return false // a fault the connection survives fails no call
	default:
		return k == "amqp" || k == "net" || (k == "not-confirmed" && c.what == "confirm")
	}
}
