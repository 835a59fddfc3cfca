// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Legacy (caller-drives-read) mode, as py-amqp, rabbitmq-c and pika's
// BlockingConnection read the socket.
//
//  1. No background goroutines: nothing reads the socket or sends
//     heartbeats unless the application calls in.
//  2. One transport lock guards the socket, for reads and writes alike. A
//     goroutine that needs a frame takes the read turn, reads under the
//     transport lock, and dispatches what it read, in order, before giving
//     the turn back. An RPC caller pumps frames this way until its own
//     reply arrives, unless the goroutine holding the turn delivers it
//     first: then it returns without ever reading. Waiters park on chans.
//  3. DrainEvents reads and dispatches at least one frame, then everything
//     already complete in the buffer. When its ctx ends first it returns
//     ctx.Err() and keeps the partial frame for the next call.
//  4. Writes, publishes included, take the transport lock: a publish waits
//     while another goroutine sits in a blocking read (with AutoDrain, or
//     in a ConsumeFunc's read, a write cuts such a read short instead, and
//     the read resumes after it: transportGuard.lock). On a transport
//     without read deadlines, such as io.Pipe, reads cannot be cut short,
//     so there the lock covers writes only, and a read ignores ctx until
//     bytes arrive.
//  5. Heartbeats are sent and checked only while the application calls in.
//  6. Close never holds the transport lock while it waits for close-ok: it
//     interrupts a blocked reader, wakes DrainEvents callers with
//     ErrClosedIntentionally, and pumps for close-ok itself.
//  7. DeferredConfirmation.Wait and WaitContext pump frames themselves.
//  8. A read error shuts the connection down; every waiter finds out on its
//     next turn.
//
// What it shares with the drainer is in readgen.go (a generation's life,
// the RPC waits, channel 0, the frame router) and readconn.go (the socket
// writer, channel-frame decoding, heartbeat arithmetic). Here is only
// legacy's own: the turn, the transport lock, and reading on the caller's
// goroutine.

// LegacyOptions tune legacy mode. The zero value is ready to use.
type LegacyOptions struct {
	// CloseTimeout bounds how long Close waits for close-ok before it
	// closes the socket. Zero means 5 seconds.
	CloseTimeout time.Duration

	// RPCTimeout bounds the wait for the reply of every synchronous
	// method, as DrainerOptions.RPCTimeout does; the caller pumps frames
	// meanwhile, as always in legacy mode. Zero, the default, waits as
	// long as the broker takes.
	RPCTimeout time.Duration

	// AutoDrain adds what a legacy application must otherwise write
	// itself to receive deliveries, confirms, notifications and
	// heartbeats: a goroutine per connection generation that loops
	// DrainEvents (autodrain.go). It lets a program that never calls
	// DrainEvents, such as a library dialling with the process default
	// (AMQP091_READ_MODE=legacy-autodrain), run in legacy mode. The
	// goroutine ends at Close or with its generation; recovery starts
	// another for the next. The connection's ReadMode is
	// "legacy-autodrain". A write (a publish, an RPC) that finds the loop
	// in a read cuts that read short instead of waiting for it, and the
	// loop reads again afterwards; plain legacy mode keeps py-amqp's wait.
	AutoDrain bool

	// CoalescePublishes lets publishes that arrive while another publish
	// of the connection is being written go out together, in the next
	// write, as DrainerOptions.CoalescePublishes does (see there for what
	// it costs and saves). Off by default.
	CoalescePublishes bool

	// Observer, if not nil, is called from the fast paths (observe.go).
	Observer *Observer
}

// Legacy returns the ReadPath of legacy (caller-drives-read) mode; set it
// as Config.ReadPath.
func Legacy(opts LegacyOptions) ReadPath {
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = defaultCloseTimeout
	}
	return legacyMode{opts}
}

type legacyMode struct{ opts LegacyOptions }

func (m legacyMode) Mode() string { return legacyModeName(m.opts) }

// legacyModeName is the ReadMode of a legacy connection: auto-drain is
// named apart, because code that branches on "legacy" is deciding whether
// it must drain.
func legacyModeName(opts LegacyOptions) string {
	if opts.AutoDrain {
		return "legacy-autodrain"
	}
	return "legacy"
}

func (m legacyMode) attach(c *Connection) readPath {
	l := &legacyConn{
		opts: m.opts,
		turn: make(chan struct{}, 1),
	}
	// Deliveries are counted for Stats, never paused on: in legacy mode
	// the caller reads, and a caller that stops reading stops the reading
	// anyway.
	l.init(c, l, legacyModeName(m.opts), m.opts.Observer, newBudget(math.MaxInt64, math.MaxInt64))
	l.rpcTimeout, l.closeTimeout = m.opts.RPCTimeout, m.opts.CloseTimeout
	l.coalesce = m.opts.CoalescePublishes
	// A method value allocates, and every publish in confirm mode hands
	// the pump out: made once.
	l.confirmWait = l.waitConfirm
	return l
}

// legacyConn is the legacy read path of one Connection.
type legacyConn struct {
	readBase
	genSlot[legacyGen, *legacyGen]
	opts LegacyOptions

	// turn is held (a value sent into it) by the goroutine that reads and
	// dispatches; a chan so that waiting for it can be a select.
	turn chan struct{}
	// transport is held across every socket read and write.
	transport sync.Mutex
	// writers counts writers waiting for the transport lock, which a
	// reader holding it gives up to them (transportGuard.lock).
	writers atomic.Int32
	// urgent counts stand-ins writing (standInSend): while one does, every
	// write cuts a read short as with AutoDrain.
	urgent atomic.Int32
	// consumerReads counts reads that a ConsumeFunc makes while it waits
	// for a delivery (directconsume.go): a write cuts those short as with
	// AutoDrain, since no caller asked for a blocking read. plainWriters
	// counts the writers of plain legacy mode waiting for the transport
	// lock, which such a read lets go first (see transportGuard.lock).
	consumerReads atomic.Int32
	plainWriters  atomic.Int32
}

// legacyGen is one connection generation. Its reading state is owned by the
// holder of the turn.
type legacyGen struct {
	readGen
	l        *legacyConn // the read path, for dispatching (handOn, route0)
	split    *frameSplitter
	content  contentReader // the turn holder's content assembly
	stateM   sync.Mutex    // guards interval to opened, never held across I/O
	interval time.Duration // heartbeat send interval, 0 for none
	lastSent time.Time     // last write to the socket
	lastRecv time.Time     // last read that returned bytes, or the start of listening
	readEnd  time.Time     // when the last read returned
	opened   bool          // handshake done
	started  time.Time     // when the generation's socket was handed over
	deadline time.Duration // how long its handshake may take (handshakeTimeout)
	// hookFirst: the last read that tried without a cancel hook waited
	// out cancelHookDelay, so reads hook at once until one ends within
	// it. Only the transport lock's holder touches it.
	hookFirst bool
}

// opened: from now on every read sets its own deadline (before, the dial's
// handshake deadline stands). The end of the handshake has just cleared the
// socket's deadlines, and a drain loop may be in a read whose deadline went
// with them (during recovery, say): interrupt it, and its retry sets its
// deadline again. A read that is not in progress ignores the interruption,
// because every read sets its own deadline first.
func (l *legacyConn) opened() {
	g := l.current()
	g.stateM.Lock()
	g.opened = true
	g.stateM.Unlock()
	l.countOpened()
	g.interrupt()
}

// handshakeTimeout is how long a generation's handshake may take: the
// dial's deadline, which legacy reads replace with their own. A recovering
// connection knows its URI, and upstream's Reconnect dials with the URI's
// connection_timeout (since v1.17.0); Open is not told the URI of a first
// dial, so that one gets upstream's default, as its dialer does without a
// connection_timeout.
func (c *Connection) handshakeTimeout() time.Duration {
	if c.url != "" {
		if uri, err := ParseURI(c.url); err == nil {
			return uri.connectionTimeout()
		}
	}
	return defaultConnectionTimeout
}

// start prepares a generation; nothing runs until someone calls in.
func (l *legacyConn) start(conn io.ReadWriteCloser) {
	g := &legacyGen{
		readGen:  newReadGen(conn),
		l:        l,
		split:    newFrameSplitter(&l.c.maxFrameSize),
		lastSent: time.Now(),
		started:  time.Now(),
		deadline: l.c.handshakeTimeout(),
	}
	g.split.counts = &l.io
	l.replace(g)
	l.install(&g.readGen, &socketWriter{conn: conn, end: &g.genEnd, counts: &l.io,
		sent: func(int64) {
			g.stateM.Lock()
			g.lastSent = time.Now()
			g.stateM.Unlock()
		},
		guard: transportGuard{l, g}})
	if l.opts.AutoDrain {
		go l.autoDrain(g)
	}
}

// transportGuard makes every write to the socket take the transport lock.
type transportGuard struct {
	l *legacyConn
	g *legacyGen
}

// lock takes the transport lock for a write. In plain legacy mode the
// write waits while another goroutine sits in a read, as py-amqp's does
// (contract point 4, and what the benchmarks compare against). With
// LegacyOptions.AutoDrain the reader is the library's own loop, which
// nobody asked to pace the writes, and a read holding the lock waits until
// its deadline (the loop's 50 ms) when nothing arrives: so the writer cuts
// the read short, and the reader, seeing a writer waiting, lets go of the
// lock and reads again afterwards.
func (w transportGuard) lock() {
	l := w.l
	if l.transport.TryLock() {
		return
	}
	if !l.opts.AutoDrain && l.urgent.Load() == 0 {
		// Plain legacy: wait for the read or write in progress, unless it
		// is a ConsumeFunc's read (directconsume.go), which nobody asked
		// to block. The writer counts itself before it looks for such a
		// read, and the reader counts itself before it looks for waiting
		// writers (readOnce): whichever comes second sees the other, so a
		// ConsumeFunc read that starts while this writer waits (for an
		// RPC's read, say) lets it go first.
		l.plainWriters.Add(1)
		if l.consumerReads.Load() == 0 {
			l.transport.Lock()
			l.plainWriters.Add(-1)
			return
		}
		l.plainWriters.Add(-1)
	}
	l.writers.Add(1)
	w.g.interrupt()
	l.transport.Lock()
	l.writers.Add(-1)
}

func (w transportGuard) unlock() { w.l.transport.Unlock() }

// heartbeater: no goroutine; heartbeats are sent while the application
// calls in.
func (l *legacyConn) heartbeater(interval time.Duration, _ chan struct{}) bool {
	g := l.current()
	g.stateM.Lock()
	g.interval = interval
	g.stateM.Unlock()
	return true
}

// errInterrupted reports a read that ended early and only asks for another
// try: a writer wants the transport lock, the end of the handshake or
// Close (for its own pump) interrupted it, or its deadline (a heartbeat
// due) passed.
var errInterrupted = errors.New("amqp: read interrupted")

// readFailure is an error that ends the generation: pump, legacy's one
// error exit, fails the connection with err.
type readFailure struct{ err *Error }

func (f readFailure) Error() string { return f.err.Error() }

// frameFailure is the readFailure of a frame that could not be read.
func frameFailure(err error) readFailure {
	return readFailure{&Error{Code: FrameError, Reason: err.Error()}}
}

// pump reads until one complete frame is buffered, then dispatches every
// complete frame. The caller holds the turn. It returns ctx.Err() if ctx
// ends before a frame is complete, keeping what was read, and
// errInterrupted when a stand-in cut its read short. It is where a read or
// a frame that ends the generation (readFailure) fails the connection.
func (l *legacyConn) pump(ctx context.Context, g *legacyGen) error {
	err := l.pumpFrames(ctx, g)
	if f, ok := err.(readFailure); ok {
		l.fail(&g.readGen, f.err)
		return l.waitErr(&g.genEnd)
	}
	return err
}

// pumpFrames is pump, with a failure returned as a readFailure.
func (l *legacyConn) pumpFrames(ctx context.Context, g *legacyGen) error {
	for {
		raw, err := g.split.next()
		if err != nil {
			return frameFailure(err)
		}
		if raw != nil {
			if _, err := l.routeFrames(g, &g.content, g.split, raw); err != nil {
				return readFailure{err}
			}
			return nil
		}
		if g.isDead() {
			return l.waitErr(&g.genEnd)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.readOnce(ctx, g); err != nil {
			if !errors.Is(err, errInterrupted) || l.urgent.Load() > 0 {
				// While a stand-in waits to write an abandoned channel's
				// close (standInSend), the caller looks at its own outcome
				// before reading on: it may be the abandoned call, whose
				// return the stand-in waits for (bounded.go, abandonAfter).
				return err
			}
		}
	}
}

// handOn is upstream's dispatchN for what one frame of a channel came to
// (routeChannel): content was assembled by the fast path (fastread.go)
// instead of the channel's state machine, which then only ever sees
// methods that start no content, and so stays in its recvMethod state. A
// complete message is dispatched as upstream's state machine would
// dispatch it.
func (g *legacyGen) handOn(step chanStep) {
	switch {
	case step.closed != nil:
		g.l.c.dispatchClosed(step.closed)
	case step.method != nil:
		step.ch.recv(step.ch, step.method)
	case step.del != nil:
		step.ch.consumers.deliver(step.del.ConsumerTag, step.del)
	case step.msg != nil:
		step.ch.dispatch(step.msg)
	}
}

// route0 is upstream's dispatch0 for f, a frame of channel 0, except for
// connection.blocked and unblocked (notifyBlocks) and a reply that would
// find connRPCCap replies waiting, which fails the connection rather than
// wait (replyOverflow).
func (g *legacyGen) route0(f frame) (stop bool, err *Error) {
	if mf, ok := f.(*methodFrame); ok {
		if g.l.notifyBlocks(mf.Method) {
			return false, nil
		}
		if _, closing := mf.Method.(*connectionClose); !closing {
			if err := g.replyOverflow(mf.Method); err != nil {
				return true, err
			}
		}
	}
	g.l.c.demux(f)
	return false, nil
}

// endedInline: connection.close, or a teardown, runs on the turn holder.
func (g *legacyGen) endedInline() bool { return g.isDead() }

// notifyBlocked hands connection.blocked or unblocked to the NotifyBlocked
// listeners ls. Upstream's dispatch0 sends holding no lock, so a shutdown
// on another goroutine (Close, a failed write) can close a listener under
// the send, which panics; holding notifyM for reading keeps shutdown from
// closing them until the send is done, and noNotify says they are gone.
func (l *legacyConn) notifyBlocked(ls []chan Blocking, b Blocking) {
	c := l.c
	c.notifyM.RLock()
	defer c.notifyM.RUnlock()
	if !c.noNotify {
		notifyAll(ls, b)
	}
}

// readOnce reads once under the transport lock, with a deadline that
// honours ctx and the heartbeat interval, and does the heartbeat duty that
// falls due while the application is calling in. It returns errInterrupted
// when the read ended early for a reason that only asks for another try.
func (l *legacyConn) readOnce(ctx context.Context, g *legacyGen) error {
	g.stateM.Lock()
	interval, lastSent, opened := g.interval, g.lastSent, g.opened
	if time.Since(g.readEnd) > interval {
		// Nobody was reading: silence until now is not the broker's
		// fault (its heartbeats wait in the socket buffer), so the
		// heartbeat check counts from here.
		g.lastRecv = time.Now()
	}
	g.stateM.Unlock()
	// The transport lock is held across the read only where a deadline
	// can end it: a transport without deadlines (io.Pipe in tests) would
	// otherwise block every writer until the peer speaks, and the peer may
	// be waiting for one of those writes.
	nc, isNet := g.conn.(net.Conn)
	if !isNet {
		n, err := g.split.fill(g.conn)
		return l.readDone(ctx, g, interval, n, err)
	}
	deadline, hasDeadline := ctx.Deadline()
	if interval > 0 {
		if beat := lastSent.Add(interval); !hasDeadline || beat.Before(deadline) {
			deadline, hasDeadline = beat, true
		}
	}
	if !hasDeadline && !opened {
		// During the handshake, stand in for the dial's handshake
		// deadline, which an earlier, shorter read may have replaced.
		deadline = g.started.Add(g.deadline)
	}
	return l.readNet(ctx, g, nc, interval, deadline)
}

// readNet is readOnce on a socket with read deadlines, which it reads
// until deadline (zero: none) or until ctx ends, holding the transport
// lock.
func (l *legacyConn) readNet(ctx context.Context, g *legacyGen, nc net.Conn, interval time.Duration, deadline time.Time) error {
	l.transport.Lock()
	if l.writers.Load() > 0 || (l.consumerReads.Load() > 0 && l.plainWriters.Load() > 0) {
		// A writer waits (for a ConsumeFunc's read, even in plain
		// legacy mode: transportGuard.lock): let it go first.
		l.transport.Unlock()
		runtime.Gosched()
		return errInterrupted
	}
	hooked := ctx.Done() == nil // nothing to hook: no cancellation
	if !hooked && !g.hookFirst && (deadline.IsZero() || time.Until(deadline) > cancelHookDelay) {
		// Most reads under load end within cancelHookDelay, and
		// hooking ctx costs allocations per read (context.AfterFunc):
		// read without the hook first, bounded by the delay.
		l.setReadDeadline(ctx, nc, time.Now().Add(cancelHookDelay))
		n, err := g.split.fill(g.conn)
		if n > 0 || !errors.Is(err, errDeadline) || ctx.Err() != nil || (l.isCalled() && !isCloser(ctx)) || l.writers.Load() > 0 {
			l.transport.Unlock()
			return l.readDone(ctx, g, interval, n, err)
		}
		// Frames come slower than the delay (an idle connection, a
		// trickle): trying first would cost a wake-up per read.
		g.hookFirst = true
	}
	var stop func() bool
	if !hooked {
		// Cancellation without a deadline interrupts the read too.
		stop = context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Now()) })
	}
	l.setReadDeadline(ctx, nc, deadline) // zero: no deadline
	var begin time.Time
	if g.hookFirst {
		begin = time.Now() // only to see whether frames come fast again
	}
	n, err := g.split.fill(g.conn)
	if g.hookFirst && n > 0 && time.Since(begin) < cancelHookDelay {
		g.hookFirst = false
	}
	l.transport.Unlock()
	if stop != nil {
		stop()
	}
	return l.readDone(ctx, g, interval, n, err)
}

// cancelHookDelay is how long a legacy read waits before it hooks its
// context's cancellation, and so the longest a cancellation (not a
// deadline, which the socket enforces) can go unnoticed by a blocked read.
// Once a read has waited that long, later reads hook at once (no extra
// wake-up while frames come slowly) until one ends within the delay.
const cancelHookDelay = time.Millisecond

// setReadDeadline sets the read deadline, then interrupts the read at
// once if ctx or Close ended it before the new deadline replaced theirs.
// The caller holds the transport lock.
func (l *legacyConn) setReadDeadline(ctx context.Context, nc net.Conn, deadline time.Time) {
	_ = nc.SetReadDeadline(deadline)
	// Checked after setting it: a cancel, a Close or a writer (see
	// transportGuard.lock) that came in between has already tried to cut
	// the read short, and the deadline above undid that.
	if ctx.Err() != nil || (l.isCalled() && !isCloser(ctx)) || l.writers.Load() > 0 {
		_ = nc.SetReadDeadline(time.Now())
	}
}

// readDone records a read's end and turns its error into readOnce's: a
// readFailure when the read failed or the broker is silent past its
// heartbeats.
func (l *legacyConn) readDone(ctx context.Context, g *legacyGen, interval time.Duration, n int, err error) error {
	g.stateM.Lock()
	g.readEnd = time.Now()
	if n > 0 {
		g.lastRecv = g.readEnd
	}
	g.stateM.Unlock()
	switch {
	case err == nil:
		return nil
	case g.isDead():
		return l.waitErr(&g.genEnd)
	case !errors.Is(err, errDeadline):
		return frameFailure(err)
	case ctx.Err() != nil:
		return ctx.Err()
	case l.isCalled() && !isCloser(ctx):
		return ErrClosedIntentionally
	case interval > 0:
		// Silence counts from the last bytes received while someone
		// was reading, not from this read's start: every read ends by
		// the next heartbeat due, so no single read lasts long enough
		// to see a dead peer.
		hb := heartbeatClock{interval}
		g.stateM.Lock()
		lastRecv, lastSent := g.lastRecv, g.lastSent
		g.stateM.Unlock()
		now := time.Now()
		if err := hb.timeout(lastRecv, now); err != nil {
			return readFailure{err}
		}
		if hb.sendDue(lastSent, now) {
			_ = l.c.send(&heartbeatFrame{})
		}
	}
	return errInterrupted
}

// closerKey marks the ctx of Close's own pumping, which an interrupted
// read must not turn into ErrClosedIntentionally.
type closerKey struct{}

func isCloser(ctx context.Context) bool { return ctx.Value(closerKey{}) != nil }

func (l *legacyConn) releaseTurn() { <-l.turn }

// drainEvents is DrainEvents in legacy mode.
func (l *legacyConn) drainEvents(ctx context.Context) error {
	g := l.current()
	if g == nil {
		return ErrClosed
	}
	return l.drainOn(ctx, g)
}

// drainOn is drainEvents on generation g, which the auto-drain loop of g
// keeps to, so that it never reads a later generation's socket.
func (l *legacyConn) drainOn(ctx context.Context, g *legacyGen) error {
	for {
		select {
		case <-l.calledC:
			return ErrClosedIntentionally
		case <-ctx.Done():
			return ctx.Err()
		case l.turn <- struct{}{}:
		}
		// select takes the turn at random when Close has also been
		// called; and a read Close ended reports how the connection
		// ended (a close-ok timeout, say). Either way the application
		// closed it, and a drain loop tells that from a lost connection
		// by ErrClosedIntentionally.
		if l.isCalled() {
			l.releaseTurn()
			return ErrClosedIntentionally
		}
		err := l.pump(ctx, g)
		l.releaseTurn()
		switch {
		case errors.Is(err, errInterrupted):
			continue
		case err != nil && ctx.Err() == nil && l.isCalled():
			return ErrClosedIntentionally
		}
		return err
	}
}

// await pumps until a reply comes in rpc, done closes (a confirmation: it
// returns nil, nil), errs reports the channel's end, ctx ends, or the
// generation ends. A reply dispatched before the error or end is the
// caller's, as upstream's reader hands it over first; here the turn holder
// dispatches both in one go, and select picks at random, so await looks
// for the reply once more before it returns an error.
func (l *legacyConn) await(ctx context.Context, g *legacyGen, rpc <-chan message, errs <-chan *Error, done <-chan struct{}) (m message, err error) {
	defer func() {
		if err != nil {
			select {
			case reply := <-rpc:
				m, err = reply, nil
			default:
			}
		}
	}()
	for {
		select {
		case m := <-rpc:
			return m, nil
		case e, ok := <-errs:
			return nil, l.chanErr(&g.readGen, e, ok)
		case <-done:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case l.turn <- struct{}{}:
		}
		if m, over, err := l.settled(g, rpc, errs, done); over {
			l.releaseTurn()
			return m, err
		}
		err := l.pump(ctx, g)
		l.releaseTurn()
		switch {
		case err == nil, errors.Is(err, errInterrupted):
		case errors.Is(err, ErrClosedIntentionally):
			return l.awaitCloser(ctx, g, rpc, errs, done)
		default:
			return nil, err
		}
	}
}

// settled looks, with the turn, for an outcome that came in just before
// it: select picks the turn at random when both are ready. Missing a
// channel error here would read on, holding the transport lock until the
// next frame or heartbeat deadline, while the channel's recovery waits to
// write. over reports an outcome, m and err are the wait's.
func (l *legacyConn) settled(g *legacyGen, rpc <-chan message, errs <-chan *Error, done <-chan struct{}) (m message, over bool, err error) {
	select {
	case m := <-rpc:
		return m, true, nil
	case e, ok := <-errs:
		return nil, true, l.chanErr(&g.readGen, e, ok)
	case <-done:
		return nil, true, nil
	default:
	}
	if g.isDead() {
		return nil, true, l.waitErr(&g.genEnd)
	}
	return nil, false, nil
}

// awaitCloser waits while Close pumps for its close-ok: it leaves the
// reading to Close and waits for what Close dispatches, or for the end.
func (l *legacyConn) awaitCloser(ctx context.Context, g *legacyGen, rpc <-chan message, errs <-chan *Error, done <-chan struct{}) (message, error) {
	select {
	case m := <-rpc:
		return m, nil
	case e, ok := <-errs:
		if ok || g.isDead() {
			return nil, l.chanErr(&g.readGen, e, ok)
		}
		// The channel closed under a live generation: the
		// application's Close is under way. (waitErr reads why the
		// generation ended, which only its end makes safe.)
		return nil, ErrClosedIntentionally
	case <-done:
		return nil, nil
	case <-g.dead:
		return nil, l.waitErr(&g.genEnd)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// awaitReply pumps for the reply (readMode.awaitReply).
func (l *legacyConn) awaitReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error) {
	return l.await(ctx, l.current(), rpc, errs, nil)
}

// standInSend writes a stand-in's channel.close as AutoDrain writes: it
// cuts a read in progress short, since in plain legacy mode that read may
// be the abandoned call's own pump, which reads on for a reply nobody
// waits for until a frame or the heartbeat deadline ends it. Cut short,
// the pump hands back to its caller (pump), which finds its channel shut
// down and returns; send, which waits for that return before it writes
// (bounded.go, abandonAfter), then goes ahead. It counts itself among the
// writers before it takes c.sendM, and cuts the read at once: the holder
// of sendM may be a plain write that waits for the same read.
func (l *legacyConn) standInSend(send func() error) error {
	l.urgent.Add(1)
	l.writers.Add(1)
	defer l.urgent.Add(-1)
	defer l.writers.Add(-1)
	if g := l.current(); g != nil {
		g.interrupt()
	}
	return send()
}

// nextReply pumps for the next reply, as chanCall does, until ctx ends.
func (l *legacyConn) nextReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error) {
	m, err := l.await(ctx, l.current(), rpc, errs, nil)
	if err == nil && m == nil {
		err = ErrClosed
	}
	return m, err
}

// consumerReader is l: a ConsumeFunc with nothing queued reads the socket
// itself (pumpFor).
func (l *legacyConn) consumerReader() consumerReader { return l }

// readTurn is the read turn, for a ConsumeFunc to take.
func (l *legacyConn) readTurn() chan struct{} { return l.turn }

// pumpFor is one turn of reading the socket for a ConsumeFunc that found
// its inbox empty; the caller took the turn. It reads and dispatches
// frames until one is complete, unless box received a delivery while the
// turn was being taken. It returns nil when the caller should look at its
// inbox again, and an error when it should stop reading: Close is pumping
// for its close-ok, or the generation ended.
func (l *legacyConn) pumpFor(ctx context.Context, box *inbox) error {
	defer l.releaseTurn()
	if l.isCalled() {
		return ErrClosedIntentionally
	}
	select {
	case <-box.wake:
		// Handed over while the turn was being taken: put the token
		// back, for the caller's next look.
		select {
		case box.wake <- struct{}{}:
		default:
		}
		return nil
	default:
	}
	g := l.current()
	if g == nil {
		return ErrClosed
	}
	if g.isDead() {
		return l.waitErr(&g.genEnd)
	}
	l.consumerReads.Add(1) // before the read takes the transport lock
	defer l.consumerReads.Add(-1)
	switch err := l.pump(ctx, g); {
	case err == nil, errors.Is(err, errInterrupted), ctx.Err() != nil:
		return nil
	default:
		return err
	}
}

// waitConfirm pumps until a DeferredConfirmation is settled.
func (l *legacyConn) waitConfirm(ctx context.Context, done <-chan struct{}) error {
	_, err := l.await(ctx, l.current(), nil, nil, done)
	return err
}

// closing is readBase.closing, then it interrupts a blocked reader so that
// Close can pump for close-ok.
func (l *legacyConn) closing() {
	l.readBase.closing()
	if g := l.current(); g != nil {
		g.interrupt()
	}
}

// flush does nothing: legacy mode hands notifications over inline, so
// nothing waits to be flushed at shutdown.
func (l *legacyConn) flush() {}
