// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"io"
	"reflect"
	"sync/atomic"
	"time"
)

// The read-path seam: a read path (Config.ReadPath, in Connection.rp) replaces upstream's
// reader and heartbeater goroutines and its RPC waits. The hooks of
// 0001-read-path-seam.patch, which PATCHES.md lists, call it, and run upstream's own code
// when c.rp is nil: that is why default mode is upstream's, byte for byte.
//
// Three interfaces, one for each side of a boundary:
//   - ReadPath is the public, sealed option: it only names a mode and attaches it.
//   - readPath is what upstream's code calls, through the hooks. readBase implements it
//     for both of our modes; a test-only probe implements it to show that the hooks reach
//     every place upstream reads (readpath_probe_test.go).
//   - readMode (readgen.go) is the boundary between our two modes: all they differ in.

// ReadPath selects who reads a Connection's socket and dispatches its frames;
// nil keeps upstream's. Sealed: values come from this package's constructors.
type ReadPath interface {
	Mode() string                  // the name Connection.ReadMode reports
	attach(c *Connection) readPath // binds to c for life, every generation
}

// connOverlay is the overlay's state in a Connection. The seam embeds it as one field, so
// that upstream's struct gains one line, and its fields read as the Connection's own.
type connOverlay struct {
	rp         readPath      // alternative read path, nil for upstream's reader
	dispatched activity      // wakes DrainEvents in upstream mode
	recovery   recoveryState // refused settlements, the secret kept for redials (recoverytags.go)
	refresh    refresher     // the refresh of expiring credentials (refresh.go)
}

// readPath is one Connection's read path, called from the seam's hooks.
type readPath interface {
	// base is what was fixed at attach (readconn.go).
	base() *readBase
	// start begins reading a generation, where upstream runs `go c.reader`: c.m and
	// c.sendM are not held, and the handshake has not begun.
	start(conn io.ReadWriteCloser)
	// heartbeater stands in for `go c.heartbeater`; false: run upstream's.
	heartbeater(interval time.Duration, done chan struct{}) bool
	// connCall waits for a sent channel-0 request's reply, matched into res as upstream
	// does (errors and rpc read under c.m). chanCall does the same on ch, whose chans
	// were read under ch.m before the send (callThrough).
	connCall(errors chan *Error, rpc chan message, res []message) error
	chanCall(ch *Channel, errors chan *Error, rpc chan message, res []message) error
	// opened runs after a handshake, once upstream cleared the socket's deadlines.
	opened()
	// closing runs when Close, CloseDeadline or closeWith begins, before it waits or sends.
	closing()
	// drainEvents is Connection.DrainEvents.
	drainEvents(ctx context.Context) error
	// shutdown runs first in every Connection.shutdown, before it locks; nil: intentional.
	shutdown(err *Error)
	// abandon ends the generation as a failed read would, without waiting (bounded.go).
	abandon(err *Error)
	// standInSend runs send, a stand-in's close, waiting for no read: the read may be the
	// abandoned call's own.
	standInSend(send func() error) error
	// nextReply waits until ctx ends for the next message in rpc, or errs, reading frames
	// if nobody else does (legacy).
	nextReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error)
	// stats fills in s, taken at now.
	stats(s *Stats, now time.Time)
}

// defaultReadPath is set only by test files (readmode.go has its place in the order).
var defaultReadPath ReadPath

// ReadMode reports "upstream", or the Mode of the read path Open chose (Config.ReadPath,
// SetDefaultReadPath, AMQP091_READ_MODE): "drainer", "legacy" or "legacy-autodrain".
func (c *Connection) ReadMode() string {
	if c.rp == nil {
		return "upstream"
	}
	return c.rp.base().name
}

// startReader starts reading a generation; Reconnect keeps c.rp and mode.
func (c *Connection) startReader(conn io.ReadWriteCloser) {
	if c.rp == nil {
		go c.reader(conn)
		return
	}
	c.rp.start(conn)
}

// startHeartbeater starts heartbeats unless the read path sends them.
func (c *Connection) startHeartbeater(interval time.Duration, done chan struct{}) {
	if c.rp != nil && c.rp.heartbeater(interval, done) {
		return
	}
	go c.heartbeater(interval, done)
}

// rpOpened, rpClosing and rpShutdown hook openComplete, beginClose and shutdown; upstream
// they only start and stop the refresh of expiring credentials, which needs an opt-in there.
func (c *Connection) rpOpened() {
	c.refreshOpened()
	if c.rp != nil {
		c.rp.opened()
	}
}
func (c *Connection) rpClosing() {
	c.refresh.stop()
	if c.rp != nil {
		c.rp.closing()
	}
}
func (c *Connection) rpShutdown(err *Error) {
	c.refresh.stop()
	if c.rp != nil {
		c.rp.shutdown(err)
	}
}

// confirmPump is what DeferredConfirmation.Wait runs first: in legacy it reads frames
// until done is closed, in the drainer it takes the read turn back from a lessee so that
// the drainer reads them; its error is ctx.Err().
type confirmPump func(ctx context.Context, done <-chan struct{}) error

// confirmPump is what a new DeferredConfirmation calls while waiting.
func (c *Connection) confirmPump() confirmPump {
	if c.rp == nil {
		return nil
	}
	return c.rp.base().confirmWait
}

// pumpUntilDone reads frames until d is done if nobody else does; it fails only if ctx ended.
func (d *DeferredConfirmation) pumpUntilDone(ctx context.Context) error {
	if d.pump != nil && d.pump(ctx, d.done) != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// rpcCap is a channel's rpc chan capacity: 0 as upstream unless the read path asks, so
// that routing a reply never waits for its caller; c may be nil (tests).
func (c *Connection) rpcCap() int {
	if c == nil || c.rp == nil {
		return 0
	}
	return c.rp.base().rpcCap
}

// callThrough is Channel.call with a read path. It takes ch's chans before sending, not
// after as upstream: recovery may replace them during send, after a channel.close reply.
func (ch *Channel) callThrough(rp readPath, req message, res []message) error {
	ch.m.Lock()
	errors, rpc := ch.errors, ch.rpc
	ch.m.Unlock()
	if err := ch.send(req); err != nil {
		return err
	}
	if !req.wait() {
		return nil
	}
	return rp.chanCall(ch, errors, rpc, res)
}

// matchReply copies msg into the first of res of its type, as upstream's call.
func matchReply(msg message, res []message) error {
	for _, try := range res {
		if reflect.TypeOf(msg) == reflect.TypeOf(try) {
			reflect.ValueOf(try).Elem().Set(reflect.ValueOf(msg).Elem())
			return nil
		}
	}
	return ErrCommandInvalid
}

// activity counts routed frames and wakes DrainEvents callers waiting for one. Per frame
// it costs an add, and a load when nobody waits: the reader must not pay for a chan per
// frame that nobody reads.
type activity struct {
	frames atomic.Uint64
	wakeup
}

// signal counts a dispatched frame and wakes the waiters.
func (a *activity) signal() {
	a.frames.Add(1)
	a.wake()
}

// wakeup wakes everyone waiting on a chan from wait; with nobody waiting, wake is a load.
//
// No wake is lost: a waiter gets its chan (wait) before it checks its condition, and a
// waker changes the condition before it swaps the chan out and closes it. So either the
// waiter's check sees the change, or the chan it holds is the one the waker closes. The
// CompareAndSwap makes every waiter between two wakes share one chan.
type wakeup struct{ waiters atomic.Pointer[chan struct{}] }

func (w *wakeup) wake() {
	if w.waiters.Load() != nil {
		if p := w.waiters.Swap(nil); p != nil {
			close(*p)
		}
	}
}

// wait returns a chan closed at the next wake.
func (w *wakeup) wait() <-chan struct{} {
	for {
		if p := w.waiters.Load(); p != nil {
			return *p
		}
		ch := make(chan struct{})
		if w.waiters.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// waitFrames waits for more than seen frames: ctx.Err() at ctx's end, errEnded when end
// or stop close.
func (a *activity) waitFrames(ctx context.Context, seen uint64, end, stop <-chan struct{}) error {
	for {
		woken := a.wait() // before the check, so no wake is lost
		if a.frames.Load() > seen {
			return nil
		}
		select {
		case <-woken:
		case <-ctx.Done():
			return ctx.Err()
		case <-end:
			return errEnded
		case <-stop:
			return errEnded
		}
	}
}

// errEnded is waitFrames' report that its end or stop chan closed.
var errEnded = errors.New("amqp: the wait ended")

// DrainEvents returns nil once a frame has been dispatched after the call started, ctx.Err() if ctx
// ends first, else what ended the connection: the *Error every waiter sees (ErrClosedIntentionally
// after Close), or ErrClosed in upstream mode. In plain legacy mode it is the read (a frame, then
// every frame buffered), and deliveries, confirms, notifications and heartbeats happen only while
// somebody calls it or waits in an RPC or DeferredConfirmation.Wait; in other modes a goroutine
// reads anyway.
func (c *Connection) DrainEvents(ctx context.Context) error {
	if c.rp == nil {
		return c.drainUpstream(ctx)
	}
	return c.rp.drainEvents(ctx)
}

// drainUpstream is DrainEvents in upstream mode; a frame that woke the caller may count.
func (c *Connection) drainUpstream(ctx context.Context) error {
	c.m.Lock()
	done := c.close
	c.m.Unlock()
	if done == nil || c.IsClosed() {
		return ErrClosed
	}
	err := c.dispatched.waitFrames(ctx, c.dispatched.frames.Load(), done, nil)
	if errors.Is(err, errEnded) {
		return ErrClosed
	}
	return err
}
