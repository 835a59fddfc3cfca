// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

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

// LegacyOptions tune legacy mode. The zero value is ready to use.
type LegacyOptions struct {
	// CloseTimeout bounds Close's wait for close-ok. Zero means 5 seconds.
	CloseTimeout time.Duration
	// RPCTimeout bounds the wait for every synchronous method's reply, as
	// DrainerOptions.RPCTimeout does. Zero, the default, waits forever.
	RPCTimeout time.Duration
	// AutoDrain loops DrainEvents on a goroutine per connection generation
	// (autodrain.go) until Close. ReadMode reports "legacy-autodrain".
	AutoDrain bool
	// CoalescePublishes sends publishes and acks that arrive during another's
	// write together, as DrainerOptions.CoalescePublishes does. Off by default.
	CoalescePublishes bool
	// Observer, if not nil, is called from the fast paths (observe.go).
	Observer *Observer
}

// Legacy returns the ReadPath of legacy (caller-drives-read) mode, as py-amqp reads; set it as
// Config.ReadPath. No goroutine reads or sends heartbeats (but AutoDrain's): RPC callers,
// DrainEvents and confirmation waits read and dispatch frames in turn; a publish waits for a
// blocking read (AutoDrain's and ConsumeFunc's it cuts short). A read error shuts the connection
// down; a DrainEvents ended by ctx keeps a partial frame.
func Legacy(opts LegacyOptions) ReadPath {
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = defaultCloseTimeout
	}
	return legacyMode{opts}
}

type legacyMode struct{ opts LegacyOptions }

func (m legacyMode) Mode() string { return legacyModeName(m.opts) }

// legacyModeName: code branching on "legacy" decides whether it must drain.
func legacyModeName(opts LegacyOptions) string {
	if opts.AutoDrain {
		return "legacy-autodrain"
	}
	return "legacy"
}

func (m legacyMode) attach(c *Connection) readPath {
	l := &legacyConn{opts: m.opts, turn: make(chan struct{}, 1)}
	// Deliveries are counted, never paused on: the caller paces the reads.
	l.init(c, l, legacyModeName(m.opts), m.opts.Observer, newBudget(math.MaxInt64, math.MaxInt64))
	l.rpcTimeout, l.closeTimeout, l.coalesce = m.opts.RPCTimeout, m.opts.CloseTimeout, m.opts.CoalescePublishes
	l.confirmWait = l.waitConfirm // made once: a method value allocates
	return l
}

// legacyConn is the legacy read path of one Connection.
type legacyConn struct {
	readBase
	genSlot[legacyGen, *legacyGen]
	opts      LegacyOptions
	turn      chan struct{} // the read turn, held by sending into it
	transport sync.Mutex    // held across every write, and every net.Conn read
	// transportGuard.lock's counts: writers cutting reads short, stand-ins
	// (standInSend), ConsumeFunc reads, and plain writers waiting on those.
	writers, urgent, consumerReads, plainWriters atomic.Int32
}

// legacyGen is one connection generation; the turn holder owns its reading.
type legacyGen struct {
	readGen
	l         *legacyConn
	split     *frameSplitter
	content   contentReader
	started   time.Time     // when the socket was handed over
	deadline  time.Duration // handshakeTimeout
	hookFirst bool          // hook ctx at once (readNet); transport lock held
	stateM    sync.Mutex    // guards the rest; never held across I/O
	interval  time.Duration // heartbeat send interval, 0 for none
	opened    bool          // handshake done
	// last write; last read with bytes, or reading resumed; last read's end
	lastSent, lastRecv, readEnd time.Time
}

// opened interrupts a read whose deadline the handshake's end just cleared.
func (l *legacyConn) opened() {
	g := l.current()
	g.stateM.Lock()
	g.opened = true
	g.stateM.Unlock()
	l.countOpened()
	g.interrupt()
}

// handshakeTimeout is the dial's deadline, which legacy reads replace, as
// upstream's Reconnect dials; a first dial's URI is unknown: the default.
func (c *Connection) handshakeTimeout() time.Duration {
	if c.url != "" {
		if uri, err := ParseURI(c.url); err == nil {
			return uri.connectionTimeout()
		}
	}
	return defaultConnectionTimeout
}

// start prepares a generation; only AutoDrain's loop runs without a caller.
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

// lock: plain legacy waits for a read, as py-amqp does, unless it is a
// ConsumeFunc's; AutoDrain and stand-ins cut it short, and the reader lets
// go (readNet). Each side counts itself before it looks at the other.
func (w transportGuard) lock() {
	l := w.l
	if l.transport.TryLock() {
		return
	}
	if !l.opts.AutoDrain && l.urgent.Load() == 0 {
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

// heartbeater starts no goroutine: reads send heartbeats (readDone).
func (l *legacyConn) heartbeater(interval time.Duration, _ chan struct{}) bool {
	g := l.current()
	g.stateM.Lock()
	g.interval = interval
	g.stateM.Unlock()
	return true
}

// errInterrupted: a read ended early and only asks for another try.
var errInterrupted = errors.New("amqp: read interrupted")

// readFailure ends the generation: pump fails the connection with err.
type readFailure struct{ err *Error }

func (f readFailure) Error() string { return f.err.Error() }

// frameFailure is the readFailure of a frame that could not be read.
func frameFailure(err error) readFailure {
	return readFailure{&Error{Code: FrameError, Reason: err.Error()}}
}

// pump is pumpFrames, and legacy's one error exit: a readFailure fails c.
func (l *legacyConn) pump(ctx context.Context, g *legacyGen) error {
	err := l.pumpFrames(ctx, g)
	if f, ok := err.(readFailure); ok {
		l.fail(&g.readGen, f.err)
		return l.waitErr(&g.genEnd)
	}
	return err
}

// pumpFrames reads until a frame is complete, then dispatches all complete
// ones (turn held); a stand-in's interruption returns, for abandonAfter.
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
		if err := l.readOnce(ctx, g); err != nil && (!errors.Is(err, errInterrupted) || l.urgent.Load() > 0) {
			return err
		}
	}
}

// handOn is upstream's dispatchN; the fast path (fastread.go) assembles
// content, so the channel's state machine stays in recvMethod.
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

// route0 is dispatch0 but for (un)blocked and replyOverflow's failure.
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

// notifyBlocked holds notifyM (read): a listener closed under the send panics.
func (l *legacyConn) notifyBlocked(ls []chan Blocking, b Blocking) {
	c := l.c
	c.notifyM.RLock()
	defer c.notifyM.RUnlock()
	if !c.noNotify {
		notifyAll(ls, b)
	}
}

// readOnce reads by ctx's deadline and the next beat; after a time unread,
// the broker's heartbeats wait in the buffer: silence counts anew.
func (l *legacyConn) readOnce(ctx context.Context, g *legacyGen) error {
	g.stateM.Lock()
	interval, lastSent, opened := g.interval, g.lastSent, g.opened
	if time.Since(g.readEnd) > interval {
		g.lastRecv = time.Now()
	}
	g.stateM.Unlock()
	nc, isNet := g.conn.(net.Conn)
	if !isNet { // can't be cut short: no lock, the peer may wait for a write
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
		deadline = g.started.Add(g.deadline) // a read may have replaced it
	}
	return l.readNet(ctx, g, nc, interval, deadline)
}

// readNet reads nc under the transport lock until deadline or ctx ends,
// first without hooking ctx, which allocates, for cancelHookDelay.
func (l *legacyConn) readNet(ctx context.Context, g *legacyGen, nc net.Conn, interval time.Duration, deadline time.Time) error {
	l.transport.Lock()
	if l.writers.Load() > 0 || (l.consumerReads.Load() > 0 && l.plainWriters.Load() > 0) {
		l.transport.Unlock() // a writer waits: let it go first
		runtime.Gosched()
		return errInterrupted
	}
	hooked := ctx.Done() == nil // nothing to hook: no cancellation
	if !hooked && !g.hookFirst && (deadline.IsZero() || time.Until(deadline) > cancelHookDelay) {
		l.setReadDeadline(ctx, nc, time.Now().Add(cancelHookDelay))
		n, err := g.split.fill(g.conn)
		if n > 0 || !errors.Is(err, errDeadline) || ctx.Err() != nil || (l.isCalled() && !isCloser(ctx)) || l.writers.Load() > 0 {
			l.transport.Unlock()
			return l.readDone(ctx, g, interval, n, err)
		}
		g.hookFirst = true // frames come slower than the delay
	}
	var stop func() bool
	if !hooked {
		stop = context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Now()) })
	}
	l.setReadDeadline(ctx, nc, deadline)
	var begin time.Time
	if g.hookFirst {
		begin = time.Now()
	}
	n, err := g.split.fill(g.conn)
	if g.hookFirst && n > 0 && time.Since(begin) < cancelHookDelay {
		g.hookFirst = false // frames come fast again
	}
	l.transport.Unlock()
	if stop != nil {
		stop()
	}
	return l.readDone(ctx, g, interval, n, err)
}

// cancelHookDelay is the longest a blocked read misses a cancellation: 10 ms, as the drainer's
// lease (readlease.go), since a deadline within 1 ms wakes the runtime each ms while streaming.
const cancelHookDelay = 10 * time.Millisecond

// setReadDeadline keeps a cut short by ctx, Close (but for its own pump) or
// a writer before the new deadline undid it. Transport lock held.
func (l *legacyConn) setReadDeadline(ctx context.Context, nc net.Conn, deadline time.Time) {
	_ = nc.SetReadDeadline(deadline)
	if ctx.Err() != nil || (l.isCalled() && !isCloser(ctx)) || l.writers.Load() > 0 {
		_ = nc.SetReadDeadline(time.Now())
	}
}

// readDone makes a read's error readOnce's, and checks heartbeats.
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

// closerKey marks Close's own pumping, which Close does not interrupt.
type closerKey struct{}

func isCloser(ctx context.Context) bool { return ctx.Value(closerKey{}) != nil }
func (l *legacyConn) releaseTurn()      { <-l.turn }

// drainEvents is DrainEvents in legacy mode.
func (l *legacyConn) drainEvents(ctx context.Context) error {
	if g := l.current(); g != nil {
		return l.drainOn(ctx, g)
	}
	return ErrClosed
}

// drainOn drains g only; after Close, ErrClosedIntentionally, not g's end.
func (l *legacyConn) drainOn(ctx context.Context, g *legacyGen) error {
	for {
		select {
		case <-l.calledC:
			return ErrClosedIntentionally
		case <-ctx.Done():
			return ctx.Err()
		case l.turn <- struct{}{}:
		}
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

// await pumps until rpc, done (nil, nil), errs, ctx or g ends; a reply
// dispatched with an end wins, as in upstream.
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

// settled finds an outcome that beat the turn, rather than read on.
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

// awaitCloser leaves the reading to Close (waitErr needs g's end).
func (l *legacyConn) awaitCloser(ctx context.Context, g *legacyGen, rpc <-chan message, errs <-chan *Error, done <-chan struct{}) (message, error) {
	select {
	case m := <-rpc:
		return m, nil
	case e, ok := <-errs:
		if ok || g.isDead() {
			return nil, l.chanErr(&g.readGen, e, ok)
		}
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

// standInSend cuts a read short (the abandoned call's pump, maybe), as a
// writer before c.sendM, whose holder may wait for that read.
func (l *legacyConn) standInSend(send func() error) error {
	l.urgent.Add(1)
	l.writers.Add(1)
	defer func() { l.writers.Add(-1); l.urgent.Add(-1) }()
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

// consumerReader: a ConsumeFunc reads the socket itself (pumpFor).
func (l *legacyConn) consumerReader() consumerReader { return l }
func (l *legacyConn) readTurn() chan struct{}        { return l.turn }

// pumpFor reads a turn for a ConsumeFunc; nil: look at its inbox again.
func (l *legacyConn) pumpFor(ctx context.Context, box *inbox) error {
	defer l.releaseTurn()
	if l.isCalled() {
		return ErrClosedIntentionally
	}
	if len(box.wake) > 0 { // a delivery came meanwhile
		return nil
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
	if err := l.pump(ctx, g); err != nil && !errors.Is(err, errInterrupted) && ctx.Err() == nil {
		return err
	}
	return nil
}

// waitConfirm pumps until a DeferredConfirmation is settled.
func (l *legacyConn) waitConfirm(ctx context.Context, done <-chan struct{}) error {
	_, err := l.await(ctx, l.current(), nil, nil, done)
	return err
}

// closing also interrupts a blocked read, so that Close can pump.
func (l *legacyConn) closing() {
	l.readBase.closing()
	if g := l.current(); g != nil {
		g.interrupt()
	}
}

// flush does nothing: legacy hands notifications over inline.
func (l *legacyConn) flush() {}
