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
	// AutoDrain reads on a goroutine per connection generation, which holds the read
	// turn as the drainer's does (autodrain.go), until Close. Frames are still dispatched
	// inline, as upstream's reader dispatches them. ReadMode reports "legacy-autodrain".
	AutoDrain bool
	// CoalescePublishes sends publishes and acks that arrive during another's
	// write together, as DrainerOptions.CoalescePublishes does. Off by default.
	CoalescePublishes bool
	// Observer, if not nil, is called from the fast paths (observe.go).
	Observer *Observer
}

// Legacy returns the ReadPath of legacy (caller-drives-read) mode, as py-amqp reads; set it
// as Config.ReadPath. No goroutine reads or sends heartbeats (but AutoDrain's): RPC callers,
// DrainEvents and confirmation waits take the read turn and read and dispatch frames in
// turn; a publish waits for a blocking read (AutoDrain's and ConsumeFunc's it cuts short).
// A read error shuts the connection down; a DrainEvents ended by ctx keeps a partial frame.
func Legacy(opts LegacyOptions) ReadPath {
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = defaultCloseTimeout
	}
	return legacyMode{opts}
}

type legacyMode struct{ opts LegacyOptions }

// Mode is "legacy" or "legacy-autodrain": code branching on "legacy" decides whether it
// must drain.
func (m legacyMode) Mode() string {
	if m.opts.AutoDrain {
		return "legacy-autodrain"
	}
	return "legacy"
}

func (m legacyMode) attach(c *Connection) readPath {
	l := &legacyConn{opts: m.opts}
	// Deliveries are counted, never paused on: the caller paces the reads.
	l.init(c, l, m.Mode(), m.opts.Observer, newBudget(math.MaxInt64, math.MaxInt64))
	l.rpcTimeout = m.opts.RPCTimeout
	l.closeTimeout = m.opts.CloseTimeout
	l.coalesce = m.opts.CoalescePublishes
	l.inline = true
	l.holder = m.opts.AutoDrain
	l.callerRead = l.pump         // callers read whenever no holder does
	l.confirmWait = l.waitConfirm // made once: a method value allocates
	return l
}

// legacyConn is the legacy read path of one Connection.
type legacyConn struct {
	readBase
	genSlot
	opts      LegacyOptions
	transport sync.Mutex // held across every write, and every net.Conn read (transportGuard)
	// transportGuard's counts, each incremented before its holder looks at the others:
	// writers cutting reads short, stand-ins (standInSend), ConsumeFunc reads, and plain
	// writers waiting for a read to end.
	writers, urgent, consumerReads, plainWriters atomic.Int32
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

// start prepares a generation; only AutoDrain's goroutine reads without a caller. The
// handshake's bound (handshakeBy) starts now, as upstream's dial deadline does, because
// legacy's reads set their own deadlines and so replace the dial's.
func (l *legacyConn) start(conn io.ReadWriteCloser) {
	g := &readGen{}
	l.initGen(g, conn)
	g.handshakeBy = time.Now().Add(l.c.handshakeTimeout())
	l.replace(g)
	l.install(g, l.writer(g, &transportGuard{l, g}))
	if l.opts.AutoDrain {
		go l.autoDrain(g)
	}
}

// transportGuard makes every write to the socket take the transport lock, which every
// net.Conn read holds too (fill). That is legacy's contract, as py-amqp's: a write waits
// for a read in progress, so that a program that never reads concurrently sees the socket
// used by one thing at a time. Two kinds of read are cut short instead, because waiting
// for them could be forever: AutoDrain's (its reads block until the broker speaks) and a
// ConsumeFunc's (it reads while its handler may publish). A stand-in's close (urgent) cuts
// any read short, since the read it would wait for may be the abandoned call's own.
//
// The handshake between a writer and such a read, with the four counters of legacyConn:
//
//   - A plain writer (no AutoDrain, no stand-in) counts itself in plainWriters, then looks
//     at consumerReads. No ConsumeFunc read: it waits for the lock as py-amqp would.
//   - Otherwise the writer counts itself in writers, then interrupts the read (a read
//     deadline of now) and waits for the lock.
//   - A read, after it took the lock and before it reads, looks at writers, and at
//     plainWriters when a ConsumeFunc read is counted in consumerReads (it is this read:
//     the turn allows one reader). Any such writer, and it lets the lock go unread
//     (errCutShort).
//
// Each side counts itself before it looks at the other, so at least one of them sees the
// other: a writer that found no ConsumeFunc read counted itself first, and the read that
// counted itself after will see it. Without that order a ConsumeFunc could start a read
// that blocks until the broker speaks, while its own handler waits for the lock to
// publish: a deadlock. The counters are atomics, not under the lock, because the writer
// must look at them while a read holds it.
type transportGuard struct {
	l *legacyConn
	g *readGen
}

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

// errInterrupted: a read ended early and only asks for another try.
var errInterrupted = errors.New("amqp: read interrupted")

// pump is a caller's read, the turn held (readBase.callerRead): read steps until one
// routes a frame. It is legacy's one error exit: a failed read fails the connection and
// returns the end's error. consumer marks a ConsumeFunc's read for the transport guard.
func (l *legacyConn) pump(ctx context.Context, g *readGen, consumer bool) error {
	if consumer {
		l.consumerReads.Add(1) // before the read takes the transport lock
		defer l.consumerReads.Add(-1)
	}
	lim := stepLimits{ctx: ctx}
	lim.until, _ = ctx.Deadline()
	for {
		if g.isDead() {
			return l.waitErr(&g.genEnd)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !g.opened.Load() && lim.until.IsZero() {
			lim.until = g.handshakeBy // a read may have replaced the dial's deadline
		}
		res := l.readStep(g, lim)
		if res.err != nil {
			l.fail(g, res.err)
			return l.waitErr(&g.genEnd)
		}
		if res.routed > 0 {
			return nil
		}
		if res.stop {
			return l.waitErr(&g.genEnd)
		}
		if err := l.cutShort(ctx, res.idle); err != nil {
			return err
		}
	}
}

// cutShort is why an idle read ends pump, nil to read on: ctx's end, Close (unless this is
// Close's own wait), or a stand-in that needs the turn's caller to look up (abandonAfter).
func (l *legacyConn) cutShort(ctx context.Context, idle bool) error {
	switch {
	case !idle:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case l.isCalled() && !isCloser(ctx):
		return ErrClosedIntentionally
	case l.urgent.Load() > 0:
		return errInterrupted
	}
	return nil
}

// handOn is upstream's dispatchN; the fast path (fastread.go) assembles
// content, so the channel's state machine stays in recvMethod.
func (l *legacyConn) handOn(step chanStep) {
	switch {
	case step.closed != nil:
		l.c.dispatchClosed(step.closed)
	case step.method != nil:
		step.ch.recv(step.ch, step.method)
	case step.del != nil:
		step.ch.consumers.deliver(step.del.ConsumerTag, step.del)
	case step.msg != nil:
		step.ch.dispatch(step.msg)
	}
}

// route0 is dispatch0 but for (un)blocked and replyOverflow's failure. Upstream's
// dispatch0 sends a reply into c.rpc and waits for its caller; here the turn holder
// routing it may be that very caller, reading for its own reply, so c.rpc is buffered
// (connRPCCap), and a reply with no room fails the connection instead of hanging it.
func (l *legacyConn) route0(g *readGen, f frame) (stop bool, err *Error) {
	if mf, ok := f.(*methodFrame); ok {
		if l.notifyBlocks(mf.Method) {
			return false, nil
		}
		if _, closing := mf.Method.(*connectionClose); !closing {
			if err := g.replyOverflow(mf.Method); err != nil {
				return true, err
			}
		}
	}
	l.c.demux(f)
	return false, nil
}

// notifyBlocked sends to the NotifyBlocked listeners inline, as upstream does, under
// notifyM (read): the teardown closes the listeners under notifyM (write), and a send to
// a chan closed under it would panic.
func (l *legacyConn) notifyBlocked(ls []chan Blocking, b Blocking) {
	c := l.c
	c.notifyM.RLock()
	defer c.notifyM.RUnlock()
	if !c.noNotify {
		notifyAll(ls, b)
	}
}

// fill reads a net.Conn under the transport lock until deadline or ctx's end. The first
// try does not hook ctx to the read (context.AfterFunc allocates): it reads for
// cancelHookDelay, and hooks ctx only if that found nothing, as when frames come slower.
func (l *legacyConn) fill(g *readGen, deadline time.Time, ctx context.Context) (int, error) {
	rs := &g.read
	if rs.nc == nil { // can't be cut short: no lock, the peer may wait for a write
		return rs.split.fill(g.conn)
	}
	if ctx == nil {
		ctx = context.Background() // AutoDrain's and a lessee's reads: nothing to hook
	}
	l.transport.Lock()
	if l.writers.Load() > 0 || (l.consumerReads.Load() > 0 && l.plainWriters.Load() > 0) {
		l.transport.Unlock() // a writer waits: let it go first
		runtime.Gosched()
		return 0, errCutShort
	}
	if ctx.Done() != nil && !rs.hookFirst && beyondHookDelay(deadline) {
		l.setReadDeadline(ctx, rs.nc, time.Now().Add(cancelHookDelay))
		n, err := rs.split.fill(g.conn)
		if n > 0 || !errors.Is(err, errDeadline) || l.cutFor(ctx) {
			l.transport.Unlock()
			return n, err
		}
		rs.hookFirst = true // frames come slower than the delay
	}
	n, err := l.hookedFill(ctx, g, deadline)
	l.transport.Unlock()
	return n, err
}

// hookedFill reads until deadline with ctx's end hooked to the read, transport lock held.
func (l *legacyConn) hookedFill(ctx context.Context, g *readGen, deadline time.Time) (int, error) {
	rs := &g.read
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = rs.nc.SetReadDeadline(time.Now()) })
		defer stop()
	}
	l.setReadDeadline(ctx, rs.nc, deadline)
	if !rs.hookFirst {
		return rs.split.fill(g.conn)
	}
	begin := time.Now()
	n, err := rs.split.fill(g.conn)
	if n > 0 && time.Since(begin) < cancelHookDelay {
		rs.hookFirst = false // frames come fast again
	}
	return n, err
}

// beyondHookDelay reports whether deadline leaves room for a first try without the hook.
func beyondHookDelay(deadline time.Time) bool {
	return deadline.IsZero() || time.Until(deadline) > cancelHookDelay
}

// cancelHookDelay is the longest a blocked read misses a cancellation: 10 ms, as the drainer's
// lease (readturn.go), since a deadline within 1 ms wakes the runtime each ms while streaming.
const cancelHookDelay = 10 * time.Millisecond

// cutFor reports whether a read must not go on: ctx ended, Close began (unless this is
// Close's own read), or a writer waits. Transport lock held.
func (l *legacyConn) cutFor(ctx context.Context) bool {
	return ctx.Err() != nil || (l.isCalled() && !isCloser(ctx)) || l.writers.Load() > 0
}

// setReadDeadline keeps a cut (cutFor) that came before the new deadline from being undone
// by it. Transport lock held.
func (l *legacyConn) setReadDeadline(ctx context.Context, nc net.Conn, deadline time.Time) {
	_ = nc.SetReadDeadline(deadline)
	if l.cutFor(ctx) {
		_ = nc.SetReadDeadline(time.Now())
	}
}

// closerKey marks Close's own pumping, which Close does not interrupt.
type closerKey struct{}

func isCloser(ctx context.Context) bool { return ctx.Value(closerKey{}) != nil }

// standInSend cuts a read short (the abandoned call's pump, maybe), as a writer before
// c.sendM, whose holder may wait for that read. urgent makes every read in progress or
// to come give way until the close is written, in plain legacy too, and makes pump
// return (cutShort) so that the abandoned call's own goroutine can notice its end.
func (l *legacyConn) standInSend(send func() error) error {
	l.urgent.Add(1)
	l.writers.Add(1)
	defer l.urgent.Add(-1)
	defer l.writers.Add(-1)
	if g := l.generation(); g != nil {
		g.interrupt()
	}
	return send()
}

// waitConfirm reads until a DeferredConfirmation is settled: in plain legacy nothing
// else would read the broker's ack, so Wait reads for it, through the one reply wait.
func (l *legacyConn) waitConfirm(ctx context.Context, done <-chan struct{}) error {
	_, err := l.awaitReply(ctx, l.generation(), replyWait{done: done})
	return err
}

// flush does nothing: legacy hands notifications over inline.
func (l *legacyConn) flush() {}
