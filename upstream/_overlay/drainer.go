// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DrainerOptions tune the dedicated-drainer read mode. The zero value is ready to use.
type DrainerOptions struct {
	// Budget bounds the bytes read that still wait for a user (queued
	// frames, undelivered notifications). Over it, the drainer stops
	// reading until usage falls to half. Zero means 64 MiB.
	Budget int64
	// CloseTimeout bounds how long Close waits for the broker's close-ok
	// (and a blocked writer) before it closes the socket. Zero means 5s.
	CloseTimeout time.Duration
	// RPCTimeout bounds the wait for the reply of every synchronous method (QueueDeclare, Qos,
	// Channel, the handshake, ...). Past it the method returns an *RPCError matching
	// ErrRPCTimeout and its channel (the connection, for a connection-level request) is closed,
	// as when a ...WithContext method's ctx ends. Close is bounded by CloseTimeout instead.
	// Zero, the default, waits as long as the broker takes.
	RPCTimeout time.Duration
	// Logger receives the drainer's warnings (watch.go): a listener or consumer holding
	// notifications too long or too much of the budget, a pause of reading and its end, a
	// listener dropped by DropStalledListener. nil, the default, is silent.
	Logger *slog.Logger
	// StallWarning is the age of a listener's or consumer's oldest queued
	// item past which it is warned about. Zero means 5s; negative, never.
	StallWarning time.Duration
	// DepthWarning is the share of Budget one listener or consumer may
	// hold before it is warned about. Zero means 0.25; negative, never.
	DepthWarning float64
	// WarnInterval is the least time between two warnings of one sort
	// (depth, stall) about one listener kind or consumer. Zero means 30s.
	WarnInterval time.Duration
	// DropStalledListener, when positive, is how long a notification may wait for a channel's
	// listener (NotifyPublish, NotifyReturn, NotifyFlow, NotifyCancel) before that listener is
	// given up: its chan closed and unregistered, its queue dropped, an error logged,
	// Stats().DroppedListeners and Observer.ListenerDropped told; all else goes on.
	// NotifyBlocked listeners are never dropped. Zero, the default, never drops: an unread
	// listener holds its channel's notifications and, once the budget is full, pauses reading.
	DropStalledListener time.Duration
	// CoalescePublishes lets publishes and acks (Ack, Nack, Reject) that arrive during a write of
	// the connection go out together in the next (groupcommit.go), each returning once written,
	// with that write's error. It trades CPU and latency for system calls and fairness
	// (docs/publishing.md has figures). Off by default; worth trying where writes cost (TLS).
	CoalescePublishes bool
	// Observer, if not nil, is called from the fast paths (observe.go).
	Observer *Observer
}

// defaultDrainerBudget is DrainerOptions.Budget when it is zero.
const defaultDrainerBudget = 64 << 20

// Drainer returns the ReadPath of the dedicated-drainer mode; set it as Config.ReadPath. One
// goroutine per connection reads the socket, never waiting on user code or on a lock held across a
// write, and hands notifications over in frame order; over Budget, it stops reading.
func Drainer(opts DrainerOptions) ReadPath {
	if opts.Budget <= 0 {
		opts.Budget = defaultDrainerBudget
	}
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = defaultCloseTimeout
	}
	return drainerMode{opts}
}

type drainerMode struct{ opts DrainerOptions }

func (drainerMode) Mode() string { return "drainer" }

func (m drainerMode) attach(c *Connection) readPath {
	o := m.opts
	d := &drainConn{opts: o, budget: newBudget(o.Budget, o.Budget/2), dispatchers: map[*Channel]*chanDispatcher{}}
	d.init(c, d, "drainer", o.Observer, d.budget)
	d.rpcTimeout, d.closeTimeout, d.coalesce = o.RPCTimeout, o.CloseTimeout, o.CoalescePublishes
	d.watch = newWatcher(o, d.budget)
	d.buffers.watch = d.watch
	d.initOutbox(&d.connOut, &c.notifyM, &c.noNotify)
	d.confirmWait = func(context.Context, <-chan struct{}) error { d.current().reclaim(); return nil }
	return d
}

// drainConn is the drainer read path of one Connection, across generations.
type drainConn struct {
	readBase
	genSlot[drainGen, *drainGen]
	opts        DrainerOptions
	budget      *budget
	connOut     outbox     // connection.blocked/unblocked, in order
	jobs        workCount  // jobs queued for dispatchers (awaited by flush, awaitReply)
	work        workCount  // items queued in outboxes (awaited by flush)
	mu          sync.Mutex // guards dispatchers and conn0; each dispatcher's outer lock
	dispatchers map[*Channel]*chanDispatcher
	conn0       *serialQueue  // channel-0 work that may block (conn0Work)
	watch       *watcher      // warnings and the stall policy (watch.go), nil without them
	pausedFor   ListenerStats // the biggest holder when reading paused (drainer goroutine only)
}

// drainGen is one connection generation: one socket, one drainer goroutine.
type drainGen struct {
	readGen
	d         *drainConn    // the read path, for routing (handOn, route0)
	done      chan struct{} // closed when the drainer goroutine has returned
	interval  atomic.Int64  // heartbeat send interval in ns, 0 until tune (or none)
	sent      atomic.Uint64 // bytes written to the socket by anyone
	lastBeat  uint64        // sent at the previous heartbeat check
	beatReady chan struct{} // closed when the heartbeat interval is known
	activity  activity      // wakes DrainEvents after frames are dispatched
	lease                   // the read turn, and its lending to ConsumeFuncs (readlease.go)
	// The read state, the turn holder's alone:
	split            *frameSplitter
	cr               *contentReader
	nc               net.Conn  // conn, if it is one: reads with deadlines
	lastRecv, dutyAt time.Time // the last read that brought bytes; the last heartbeat duty (heartbeatClock)
	capped           bool      // the read deadline is a lessee's cap
	rdl              time.Time // the read deadline as last set, zero once one passed
}

// start runs a new generation's drainer once the previous one has exited.
func (d *drainConn) start(conn io.ReadWriteCloser) {
	g := &drainGen{readGen: newReadGen(conn), d: d, done: make(chan struct{}), beatReady: make(chan struct{}),
		lease: lease{turn: make(chan struct{}, 1), back: make(chan struct{}, 1)}}
	prev := d.replace(g)
	d.install(&g.readGen, &socketWriter{conn: conn, end: &g.genEnd, counts: &d.io,
		sent: func(n int64) { g.sent.Add(uint64(n)) }})
	go g.run(d, prev)
}

// heartbeater takes over heartbeats on a net.Conn (read deadlines as timer).
func (d *drainConn) heartbeater(interval time.Duration, _ chan struct{}) bool {
	g := d.current()
	if _, ok := g.conn.(net.Conn); !ok {
		return false
	}
	g.interval.Store(int64(interval))
	close(g.beatReady)
	return true
}

// run is the drainer goroutine, the one exit that fails the connection.
func (g *drainGen) run(d *drainConn, prev *drainGen) {
	defer close(g.done)
	if prev != nil {
		<-prev.done
	}
	if err := g.loop(d); err != nil {
		d.fail(&g.readGen, err)
	}
}

// loop reads and routes frames; nil after connection.close or a chosen end.
// Between reads it may lend the read turn to a waiting ConsumeFunc (lend).
func (g *drainGen) loop(d *drainConn) *Error {
	g.split = newFrameSplitter(&d.c.maxFrameSize)
	g.split.counts = &d.io
	g.cr = &contentReader{budget: d.budget}
	defer g.cr.release() // content cut short by the generation's end
	g.nc, _ = g.conn.(net.Conn)
	g.lastRecv = time.Now()
	g.watch = time.NewTimer(leaseCheck)
	g.watch.Stop()
	g.turn <- struct{}{}
	for {
		if over, below := d.budget.over(); over {
			if resumed, err := g.pause(d, below, g.clock().interval); !resumed {
				return err
			}
			g.lastRecv = time.Now() // a pause we chose is not a silent broker
		}
		if _, stop, err := g.readStep(d, 0); stop {
			return err
		}
		if g.wanted.Load() && g.nc != nil && g.wanted.Swap(false) {
			if stop, err := g.lend(); stop {
				return err
			}
		}
	}
}

// readStep reads once, then routes what is complete: the turn holder's. A positive quiet (a
// lessee's) caps the read's wait; idle reports that the cap passed with nothing read.
func (g *drainGen) readStep(d *drainConn, quiet time.Duration) (idle, stop bool, err *Error) {
	hb := g.clock()
	if g.nc != nil && (hb.interval > 0 || quiet > 0 || g.capped) {
		var deadline time.Time
		if hb.interval > 0 {
			if g.dutyAt.IsZero() {
				g.dutyAt = time.Now()
			}
			deadline = hb.readDeadline(g.lastRecv, g.dutyAt)
		}
		if quiet > 0 {
			deadline = g.quietCap(deadline, quiet)
		}
		g.capped = quiet > 0
		if !deadline.Equal(g.rdl) { // each new deadline resets a runtime timer
			_ = g.nc.SetReadDeadline(deadline)
			g.rdl = deadline
		}
	}
	n, rerr := g.split.fill(g.conn)
	if n > 0 {
		g.lastRecv = time.Now()
		if hb.interval > 0 && hb.piggyback(g.dutyAt, g.lastRecv) {
			if err := g.beat(d, hb.interval); err != nil {
				return false, true, err
			}
			g.dutyAt = g.lastRecv
		}
	}
	switch {
	case rerr == nil:
	case (hb.interval > 0 || g.capped) && errors.Is(rerr, errDeadline):
		g.rdl = time.Time{} // passed (maybe one set by another, as opened): set it anew
		now := time.Now()
		if err := hb.timeout(g.lastRecv, now); err != nil {
			return false, true, err
		}
		if hb.interval > 0 && hb.dutyDue(g.dutyAt, now) {
			if err := g.beat(d, hb.interval); err != nil {
				return false, true, err
			}
			g.dutyAt = now
		}
		idle = g.capped
	case g.isDead():
		return false, true, nil // closed on purpose: Close, a watchdog, or a write error
	default:
		return false, true, &Error{Code: FrameError, Reason: rerr.Error()}
	}
	stop, err = d.routeFrames(g, g.cr, g.split, nil)
	g.activity.wake()
	return idle, stop, err
}

// route0 routes a channel-0 frame, counted first: a caller it wakes must
// not take it for progress made after its DrainEvents began.
func (g *drainGen) route0(f frame) (stop bool, err *Error) {
	g.activity.frames.Add(1)
	return g.d.route(g, f)
}

// clock is the heartbeat clock: a zero interval until tune has set one.
func (g *drainGen) clock() heartbeatClock {
	select {
	case <-g.beatReady:
		return heartbeatClock{time.Duration(g.interval.Load())}
	default:
		return heartbeatClock{}
	}
}

// pause waits, beating, until users took enough; false once g ended.
func (g *drainGen) pause(d *drainConn, below <-chan struct{}, interval time.Duration) (resumed bool, err *Error) {
	d.pauseBegan()
	defer d.pauseEnded()
	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-below:
			return true, nil
		case <-g.dead:
			return false, nil
		case <-tick:
			if err := g.beat(d, interval); err != nil {
				return false, err
			}
		}
	}
}

// heartbeatBytes is a heartbeat frame on the wire (spec 4.2.7).
var heartbeatBytes = []byte{frameHeartbeat, 0, 0, 0, 0, 0, 0, frameEnd}

// beat sends a heartbeat if nothing was written since the last check, never
// waiting for sendM (its holder is traffic), under a write deadline.
func (g *drainGen) beat(d *drainConn, interval time.Duration) *Error {
	if sent := g.sent.Load(); sent != g.lastBeat {
		g.lastBeat = sent
		return nil
	}
	if !d.c.sendM.TryLock() {
		return nil
	}
	defer d.c.sendM.Unlock()
	if bw, ok := d.c.writer.w.(*bufio.Writer); ok && bw.Buffered() > 0 {
		return nil // a publish is between frames: traffic is flowing
	}
	nc, ok := g.conn.(net.Conn) // always, as heartbeater checked; never panic
	if !ok {
		return nil
	}
	_ = nc.SetWriteDeadline(time.Now().Add(interval))
	n, err := nc.Write(heartbeatBytes)
	_ = nc.SetWriteDeadline(time.Time{})
	g.sent.Add(uint64(n))
	d.io.wrote(heartbeatBytes[:n]) // at a frame boundary: the buffer is empty
	g.lastBeat = g.sent.Load()
	if err == nil || n == 0 && errors.Is(err, errDeadline) {
		return nil // nothing written at the deadline: the broker is not reading, try later
	}
	return &Error{Code: FrameError, Reason: fmt.Sprintf("writing a heartbeat: %v", err)}
}

// awaitReply is readMode.awaitReply. The end overtakes what dispatchers
// still have to run, so a channel's caller waits for them (CloseTimeout).
func (d *drainConn) awaitReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error) {
	g := d.current()
	g.reclaim()
	var err error
	select {
	case msg := <-rpc:
		return msg, nil
	case <-ctx.Done():
		err = ctx.Err()
	case e, ok := <-errs:
		err = d.chanErr(&g.readGen, e, ok)
	case <-g.dead:
		err = d.waitErr(&g.genEnd)
	}
	for wait := errs != nil && ctx.Err() == nil; ; wait = false {
		select {
		case msg := <-rpc:
			return msg, nil
		default:
		}
		if !wait || !g.isDead() {
			return nil, err
		}
		d.jobs.waitIdle(time.Now().Add(d.opts.CloseTimeout))
	}
}

// Simple hooks: route stops the drainer after connection.close, nothing
// holds the socket across a read, and RPC callers wait for its reader.
func (g *drainGen) endedInline() bool                    { return false }
func (d *drainConn) standInSend(send func() error) error { return send() }
func (d *drainConn) nextReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error) {
	return waitReply(ctx, errs, rpc)
}

// opened re-arms the read deadline the handshake's end cleared.
func (d *drainConn) opened() {
	g := d.current()
	d.countOpened()
	if interval := g.clock().interval; interval > 0 {
		if nc, ok := g.conn.(net.Conn); ok {
			_ = nc.SetReadDeadline(time.Now().Add(interval))
		}
	}
}

// flush lets what was read before the end reach the listeners before the
// teardown closes them, until Close's deadline (else CloseTimeout from now).
func (d *drainConn) flush() {
	deadline, ok := d.closeDeadline()
	if !ok || !d.isCalled() {
		deadline = time.Now().Add(d.opts.CloseTimeout) // recovery may follow, with a stale deadline
	}
	if d.jobs.waitIdle(deadline) && d.work.waitIdle(deadline) {
		return
	}
	d.mu.Lock()
	for _, disp := range d.dispatchers {
		disp.out.dropQueued()
	}
	d.mu.Unlock()
	d.connOut.dropQueued()
}

// drainEvents is DrainEvents in drainer mode.
func (d *drainConn) drainEvents(ctx context.Context) error {
	g := d.current()
	if g == nil {
		return ErrClosed
	}
	seen := g.activity.frames.Load()
	select {
	case <-d.calledC:
	case <-g.dead:
	default:
		if err := g.activity.waitFrames(ctx, seen, g.dead, d.calledC); !errors.Is(err, errEnded) {
			return err
		}
	}
	select {
	case <-d.calledC:
		return ErrClosedIntentionally
	default:
		return d.waitErr(&g.genEnd)
	}
}
