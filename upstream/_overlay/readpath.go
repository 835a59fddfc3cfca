// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
	"io"
	"reflect"
	"sync/atomic"
	"time"
)

// The read-path seam.
//
// Upstream amqp091-go gives every connection generation one reader goroutine
// (Connection.reader) and one heartbeater goroutine, and makes RPC callers
// wait on unbuffered chans that the reader feeds. A read path replaces that
// arrangement for one Connection (Config.ReadPath, kept in Connection.rp).
// The seam is the set of hooks that upstream/patches/0001-read-path-seam.patch
// adds; each is a nil check, or a call that runs upstream's statement when
// the Connection has no read path:
//
//  1. Open calls startAndOpen (readmode.go), which chooses the read path
//     and calls startReader, where upstream runs `go c.reader` and then
//     c.open; Reconnect calls startReader where upstream runs `go c.reader`.
//  2. openTune calls startHeartbeater where upstream runs `go c.heartbeater`.
//  3. Connection.call hands the wait for a reply to connCall, after the
//     request has been sent; Channel.call hands the whole call to
//     callThrough, which sends and waits with chanCall.
//  4. newChannel and Channel.resetState size each channel's rpc chan with
//     rpcCap; newChannel builds its consumers with makeConsumers, and
//     consumers.add runs each buffer with bufferFor, which tie buffered
//     deliveries to the read path's budget (inbox.go, consumeloop.go).
//  5. PublishWithDeferredConfirm gives each DeferredConfirmation the read
//     path's confirm pump (its pump field), which Wait and WaitContext call
//     through pumpUntilDone, so they can read frames themselves.
//  6. PublishWithContext and PublishWithDeferredConfirmWithContext publish
//     through publishCtx and publishDeferredCtx (publish.go): with a read
//     path they wait, honouring ctx, while the broker blocks the connection
//     (blockgate.go) and take the publish fast path; without one they call
//     upstream's Publish and PublishWithDeferredConfirm.
//  7. openComplete calls opened after it has cleared the socket's
//     deadlines at the end of the handshake.
//  8. beginClose calls closing once a close has been initiated, before it
//     waits for an in-flight Reconnect.
//  9. shutdown calls the read path's shutdown first, before it takes any lock.
// 10. upstream's reader signals Connection.dispatched after each frame, so
//     DrainEvents works in upstream mode too.

// ReadPath selects who reads a Connection's socket and dispatches its frames.
//
// The zero value, nil, keeps upstream's reader goroutine and heartbeater: a
// Connection dialled without a ReadPath behaves exactly as upstream
// amqp091-go. Non-nil values come from this package's read-mode
// constructors. The interface is sealed (it has an unexported method) so
// that every read path is one that was written against the seam's contract.
type ReadPath interface {
	// Mode names the read path, as Connection.ReadMode reports it.
	Mode() string

	// attach binds the read path to one Connection for the Connection's
	// whole life, across every Reconnect generation.
	attach(c *Connection) readPath
}

// readPath is one Connection's read path, called from the seam's hooks.
type readPath interface {
	// base is what the read path fixed when it was attached, and what the
	// hooks read of it: its mode, the capacity of the channels' rpc
	// chans, the budget that buffered deliveries count against, the
	// confirm pump, the publish gate and socket writer, the Observer,
	// where consumer buffers register, and the mode's own parts (readconn.go).
	base() *readBase

	// start takes over reading conn, the socket of a new connection
	// generation, in place of `go c.reader(conn)`. It is called without
	// locks held, before the AMQP handshake of that generation is sent.
	start(conn io.ReadWriteCloser)

	// heartbeater is called in place of `go c.heartbeater(interval, done)`
	// once per generation. Returning false runs upstream's heartbeater.
	heartbeater(interval time.Duration, done chan struct{}) bool

	// connCall waits for the reply to a channel-0 request that the caller
	// has already sent, matching it into one of res as upstream does.
	// errors and rpc are the generation's chans, read under c.m.
	connCall(errors chan *Error, rpc chan message, res []message) error

	// chanCall is connCall for a synchronous request on channel ch;
	// errors and rpc are the channel's chans as they were, under ch.m,
	// before the request was sent (callThrough).
	chanCall(ch *Channel, errors chan *Error, rpc chan message, res []message) error

	// opened runs when a generation's handshake has completed, right after
	// upstream cleared the socket's read and write deadlines.
	opened()

	// closing runs once Close, CloseDeadline or closeWith has initiated the
	// close, and before it waits for an in-flight Reconnect or sends
	// connection.close.
	closing()

	// drainEvents is Connection.DrainEvents in this read mode.
	drainEvents(ctx context.Context) error

	// shutdown runs first in every call of Connection.shutdown, with the
	// same error (nil for an intentional close), before any lock is taken.
	shutdown(err *Error)

	// abandon ends the current generation with err, as a failed read
	// would, without waiting: a connection-level request got no reply in
	// time (bounded.go).
	abandon(err *Error)

	// standInSend runs send, the write of an abandoned channel's
	// channel.close by its stand-in (bounded.go), which must not wait for
	// a read in progress: that read may be the abandoned call's own.
	standInSend(send func() error) error

	// nextReply waits until ctx ends for the next message in rpc, or for
	// errs, reading frames meanwhile if nobody else does (legacy).
	nextReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error)

	// stats fills in s, a snapshot taken at now, with what this read path
	// counts and holds (stats.go).
	stats(s *Stats, now time.Time)
}

// defaultReadPath serves connections whose Config.ReadPath is nil when no
// SetDefaultReadPath value is set (readmode.go gives the whole order). It
// is nil in every production build; only a test-only file may set it (and
// defaultReadPathForced), to force a read mode on upstream's own test
// suite.
var defaultReadPath ReadPath

// ReadMode reports which read path serves this connection: "upstream" for
// upstream's reader goroutine, or else the Mode of the read path chosen
// when the connection was opened, Config.ReadPath or the process default
// (SetDefaultReadPath, AMQP091_READ_MODE): "drainer", "legacy" or
// "legacy-autodrain".
func (c *Connection) ReadMode() string {
	if c.rp == nil {
		return "upstream"
	}
	return c.rp.base().name
}

// startReader starts reading a new connection generation: the read path's
// own reader when there is one, upstream's reader goroutine otherwise.
// Open chose c.rp (startAndOpen, readmode.go); Reconnect keeps it, so a
// connection never changes mode between generations.
func (c *Connection) startReader(conn io.ReadWriteCloser) {
	if c.rp == nil {
		go c.reader(conn)
		return
	}
	c.rp.start(conn)
}

// startHeartbeater starts heartbeats for a new connection generation, unless
// the read path sends them itself.
func (c *Connection) startHeartbeater(interval time.Duration, done chan struct{}) {
	if c.rp != nil && c.rp.heartbeater(interval, done) {
		return
	}
	go c.heartbeater(interval, done)
}

// rpOpened, rpClosing and rpShutdown are the hooks in openComplete,
// beginClose and shutdown; each does nothing without a read path.
func (c *Connection) rpOpened() {
	if c.rp != nil {
		c.rp.opened()
	}
}

func (c *Connection) rpClosing() {
	if c.rp != nil {
		c.rp.closing()
	}
}

func (c *Connection) rpShutdown(err *Error) {
	if c.rp != nil {
		c.rp.shutdown(err)
	}
}

// confirmPump reads frames until done is closed or ctx ends; it returns
// ctx.Err() in the latter case.
type confirmPump func(ctx context.Context, done <-chan struct{}) error

// confirmPump is what a new DeferredConfirmation calls while waiting.
func (c *Connection) confirmPump() confirmPump {
	if c.rp == nil {
		return nil
	}
	return c.rp.base().confirmWait
}

// pumpUntilDone reads frames while waiting for the confirmation, in a read
// mode where nobody else does. It returns an error only when ctx ended.
func (d *DeferredConfirmation) pumpUntilDone(ctx context.Context) error {
	if d.pump == nil {
		return nil
	}
	if err := d.pump(ctx, d.done); err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// rpcCap is the capacity of a channel's rpc chan: 0, as upstream, unless the
// read path asks for a buffer. Tests build channels on a nil or bare
// Connection, so it must not assume either.
func (c *Connection) rpcCap() int {
	if c == nil || c.rp == nil {
		return 0
	}
	return c.rp.base().rpcCap
}

// callThrough is Channel.call on a connection with a read path. It takes
// the channel's errors and rpc chans before it sends the request, where
// upstream's call takes them after: a reply that is a channel.close (a
// passive declare of a missing queue, say) ends the channel, and recovery
// resets it at once with new chans, on which a caller that looked only
// after would wait for ever. A read path can dispatch the close while the
// caller is still in send (legacy-autodrain hung upstream's
// TestChannelRecoveryRestoresQosInEveryTopologyRecoveryMode once in about
// a hundred runs under -race); taken before, the chans are the ones that
// channel's reply or end reaches.
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

// matchReply copies msg into the first of res with the same concrete type, as
// upstream's call does, for read paths that wait for replies themselves.
func matchReply(msg message, res []message) error {
	for _, try := range res {
		if reflect.TypeOf(msg) == reflect.TypeOf(try) {
			reflect.ValueOf(try).Elem().Set(reflect.ValueOf(msg).Elem())
			return nil
		}
	}
	return ErrCommandInvalid
}

// activity counts dispatched frames and wakes goroutines waiting for more.
// With nobody waiting, signal costs an atomic add and load: it sits on
// upstream's reader loop, once per frame.
type activity struct {
	frames  atomic.Uint64
	waiters atomic.Pointer[chan struct{}]
}

// signal counts a frame that has been dispatched and wakes the waiters.
func (a *activity) signal() {
	a.frames.Add(1)
	a.wake()
}

// wake wakes everyone waiting on a chan from wait.
func (a *activity) wake() {
	if a.waiters.Load() == nil {
		return
	}
	if p := a.waiters.Swap(nil); p != nil {
		close(*p)
	}
}

// wait returns a chan closed at the next wake.
func (a *activity) wait() <-chan struct{} {
	for {
		if p := a.waiters.Load(); p != nil {
			return *p
		}
		ch := make(chan struct{})
		if a.waiters.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// waitFrames waits until more than seen frames have been counted. It
// returns ctx.Err() if ctx ends first, or errEnded if end or stop (either
// may be nil) is closed first.
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

// errEnded is waitFrames' report that its end chan closed.
var errEnded = errors.New("amqp: the wait ended")

// DrainEvents waits for the connection to make progress. It returns nil
// once at least one frame has been dispatched after the call started,
// ctx.Err() if ctx ends first (errors.Is matches context.DeadlineExceeded
// or context.Canceled), and otherwise the error that ended the connection:
// in drainer and legacy modes the *Error every waiter sees, or
// ErrClosedIntentionally after Close; in upstream mode ErrClosed.
//
// In upstream and drainer modes, and in legacy mode with AutoDrain, a
// goroutine of the connection reads the socket whether or not anyone calls
// DrainEvents: it is a way to wait for traffic, not a requirement. In
// plain legacy mode it is the read: the caller reads and dispatches at
// least one frame, then every frame already complete in the buffer, and
// deliveries, confirms, notifications and heartbeats happen only while
// somebody calls it (or waits in an RPC or DeferredConfirmation.Wait).
func (c *Connection) DrainEvents(ctx context.Context) error {
	if c.rp == nil {
		return c.drainUpstream(ctx)
	}
	return c.rp.drainEvents(ctx)
}

// drainUpstream is DrainEvents for upstream's reader goroutine. Upstream's
// reader counts a frame after dispatching it, so a frame whose dispatch
// woke the caller just before the call may count as progress.
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
