// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

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

// Dedicated-drainer read mode.
//
// One goroutine per connection generation, the drainer, owns the socket
// read. Its contract:
//
//  1. It reads whatever bytes are available into its own buffer and
//     dispatches only complete frames (framesplit.go); a read deadline in
//     the middle of a frame keeps the partial bytes.
//  2. It never waits on user code or on a lock that anyone holds across a
//     network write: channel frames go to a per-channel dispatcher
//     goroutine (started on demand, parked a while when idle, then gone:
//     drainer_dispatch.go, workqueue.go), notifications to the channel's
//     outbox (outbox.go), which hands them over in the order the frames
//     arrived, across listeners, as upstream's reader does, and replies
//     that need a network write (close-ok, flow-ok, cancel-ok) are written
//     by a dispatcher or the channel-0 queue (conn0Work), never by the
//     drainer.
//  3. Everything queued for users counts against a budget. Over it, the
//     drainer stops reading (TCP backpressure) until users catch up.
//  4. Heartbeats live in the same loop: read deadlines double as the timer.
//     A heartbeat is sent only when nothing else was written during the
//     interval, and never by waiting for the write lock. A broker silent
//     for three intervals (1.5 × the negotiated heartbeat, as upstream) is
//     declared dead.
//  5. On a connection error, every waiter is released at once with the
//     same *Error. An intentional Close releases them with
//     ErrClosedIntentionally.
//  6. Close is bounded: if the broker does not answer close-ok within
//     DrainerOptions.CloseTimeout, the socket is closed, which also frees a
//     publisher blocked in a write.
//
// What it shares with legacy mode is in readgen.go (a generation's life,
// the RPC waits, channel 0, the frame router) and readconn.go (the socket
// writer, channel-frame decoding, heartbeat arithmetic). Here is only the
// drainer's own: the loop, its heartbeat duty, the budget's pause, and how
// a waiter waits for its reply.

// DrainerOptions tune the dedicated-drainer read mode. The zero value is
// ready to use.
type DrainerOptions struct {
	// Budget bounds the bytes read from the socket that still wait for a
	// user (queued frames and undelivered notifications). Over it, the
	// drainer stops reading until usage falls to half the budget.
	// Zero means 64 MiB.
	Budget int64

	// CloseTimeout bounds how long Close waits for the broker's close-ok
	// (and for a blocked writer) before it closes the socket. Zero means
	// 5 seconds.
	CloseTimeout time.Duration

	// RPCTimeout bounds the wait for the reply of every synchronous
	// method (QueueDeclare, Qos, Channel, the handshake, ...), for code
	// that cannot pass a context. A method without a reply within it
	// returns an *RPCError matching ErrRPCTimeout, and its channel is
	// closed (the connection, for a connection-level request), as when
	// the ctx of a ...WithContext method ends. Close's own wait is bounded
	// by CloseTimeout instead. Zero, the default, waits as upstream does:
	// as long as the broker takes.
	RPCTimeout time.Duration

	// Logger receives the drainer's warnings (watch.go): a listener or
	// consumer that holds notifications too long or too much of the
	// budget, a pause of reading for the budget and its end, a listener
	// dropped by DropStalledListener. nil, the default, is silent.
	Logger *slog.Logger

	// StallWarning is the age of a listener's or consumer's oldest queued
	// item past which it is warned about. Zero means 5 seconds; negative
	// turns the age warning off.
	StallWarning time.Duration

	// DepthWarning is the share of Budget that one listener or consumer
	// may hold before it is warned about. Zero means 0.25; negative turns
	// the depth warning off.
	DepthWarning float64

	// WarnInterval is the least time between two warnings about one
	// listener or consumer. Zero means 30 seconds.
	WarnInterval time.Duration

	// DropStalledListener, when positive, is how long a notification may
	// wait for a channel's listener (NotifyPublish, NotifyReturn,
	// NotifyFlow, NotifyCancel) before that listener is given up: its
	// chan is closed and unregistered, what was queued for it is
	// dropped, an error is logged, Stats().DroppedListeners counts it and
	// Observer.ListenerDropped hears of it. The connection, the channel,
	// its other listeners and its DeferredConfirmations go on.
	// NotifyBlocked listeners, two notifications per alarm, are never
	// dropped. Zero, the default, never drops: a listener nobody reads
	// holds its channel's notifications and, once the budget is full,
	// pauses reading.
	DropStalledListener time.Duration

	// CoalescePublishes lets publishes that arrive while another publish
	// of the connection is being written go out together, in the next
	// write (groupcommit.go). Each publish still returns once its own
	// frames are written, with that write's error. It trades CPU and
	// latency for system calls and fairness: a publisher that joins a
	// batch parks until the batch is written. With 100 goroutines
	// publishing on one connection (make bench's scenario 3, 2 shared
	// vCPUs, one run) it wrote 0.66 system calls per message instead of
	// 1.0 and brought the slowest publisher 12× closer to the fastest,
	// but cost 1.4× the CPU per message, and at 10 publishers the publish
	// call's P99 rose from 0.005 to 0.14 ms. Off by default; worth trying
	// where a write costs more than a wake-up (TLS, a slow socket).
	CoalescePublishes bool

	// Observer, if not nil, is called from the fast paths (observe.go).
	Observer *Observer
}

// defaultDrainerBudget is DrainerOptions.Budget when it is zero.
const defaultDrainerBudget = 64 << 20

// Drainer returns the ReadPath of the dedicated-drainer mode; set it as
// Config.ReadPath.
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
	d := &drainConn{
		opts:        m.opts,
		budget:      newBudget(m.opts.Budget, m.opts.Budget/2),
		dispatchers: map[*Channel]*chanDispatcher{},
	}
	d.init(c, d, "drainer", m.opts.Observer, d.budget)
	d.rpcTimeout, d.closeTimeout = m.opts.RPCTimeout, m.opts.CloseTimeout
	d.coalesce = m.opts.CoalescePublishes
	d.watch = newWatcher(m.opts, d.budget)
	d.buffers.watch = d.watch
	d.initOutbox(&d.connOut, &c.notifyM, &c.noNotify)
	return d
}

// drainConn is the drainer read path of one Connection, across generations.
type drainConn struct {
	readBase
	genSlot[drainGen, *drainGen]
	opts   DrainerOptions
	budget *budget
	// connOut hands connection.blocked/unblocked over in order; jobs and
	// work count what dispatchers and outboxes still have to do, which
	// the end of the connection waits for (flush, awaitReply).
	connOut outbox
	jobs    workCount // jobs queued for channel dispatchers
	work    workCount // items queued in outboxes

	mu          sync.Mutex // guards dispatchers and conn0; each dispatcher's outer lock
	dispatchers map[*Channel]*chanDispatcher
	conn0       *serialQueue // channel-0 work that may block (conn0Work)

	watch     *watcher      // warnings and the stall policy (watch.go), nil without them
	pausedFor ListenerStats // the biggest holder when reading paused (drainer goroutine only)
}

// drainGen is one connection generation: one socket, one drainer goroutine.
type drainGen struct {
	readGen
	d    *drainConn    // the read path, for routing (handOn, route0)
	done chan struct{} // closed when the drainer goroutine has returned

	interval  atomic.Int64  // heartbeat send interval in ns, 0 until tune (or none)
	sent      atomic.Uint64 // bytes written to the socket by anyone
	lastBeat  uint64        // sent at the previous heartbeat check
	beatReady chan struct{} // closed when the heartbeat interval is known

	activity activity // wakes DrainEvents after frames are dispatched
}

// start runs a new generation's drainer once the previous one has exited,
// so that no two generations ever read one connection.
func (d *drainConn) start(conn io.ReadWriteCloser) {
	g := &drainGen{
		readGen:   newReadGen(conn),
		d:         d,
		done:      make(chan struct{}),
		beatReady: make(chan struct{}),
	}
	prev := d.replace(g)
	// Every byte written is counted, so that the heartbeat knows whether
	// anything else went out during an interval without taking the write
	// lock.
	d.install(&g.readGen, &socketWriter{conn: conn, end: &g.genEnd, counts: &d.io,
		sent: func(n int64) { g.sent.Add(uint64(n)) }})
	go g.run(d, prev)
}

// heartbeater takes over heartbeats when the socket supports read
// deadlines, which the drainer uses as its timer. Transports without them
// (io.Pipe in tests) keep upstream's heartbeater.
func (d *drainConn) heartbeater(interval time.Duration, _ chan struct{}) bool {
	g := d.current()
	if _, ok := g.conn.(net.Conn); !ok {
		return false
	}
	g.interval.Store(int64(interval))
	close(g.beatReady)
	return true
}

// run is the drainer goroutine of one generation. It starts once the
// previous generation's has returned, reads until the generation ends, and
// is the one place where the end of reading fails the connection.
func (g *drainGen) run(d *drainConn, prev *drainGen) {
	defer close(g.done)
	if prev != nil {
		<-prev.done
	}
	if err := g.loop(d); err != nil {
		d.fail(&g.readGen, err)
	}
}

// loop reads and routes frames until reading must end. It returns the
// error to fail the connection with, or nil when reading simply stops:
// connection.close was routed (its close-ok and the teardown run off the
// drainer), or the generation was ended on purpose (Close, the watchdog, a
// failed write) and the read saw the socket closed.
func (g *drainGen) loop(d *drainConn) *Error {
	split := newFrameSplitter(&d.c.maxFrameSize)
	split.counts = &d.io
	cr := &contentReader{budget: d.budget}
	defer cr.release() // content cut short by the generation's end
	deadliner, _ := g.conn.(net.Conn)
	lastRecv := time.Now()
	// dutyAt is when the heartbeat duty was last done (see
	// heartbeatClock.window and piggyback); zero until heartbeats start.
	var dutyAt time.Time

	for {
		if stop, err := d.routeFrames(g, cr, split, nil); stop {
			return err
		}
		g.activity.wake()

		hb := g.clock()
		if over, below := d.budget.over(); over {
			if resumed, err := g.pause(d, below, hb.interval); !resumed {
				return err
			}
			lastRecv = time.Now() // a pause we chose is not a silent broker
		}
		if hb.interval > 0 && deadliner != nil {
			if dutyAt.IsZero() {
				dutyAt = time.Now()
			}
			_ = deadliner.SetReadDeadline(hb.readDeadline(lastRecv, dutyAt))
		}

		n, err := split.fill(g.conn)
		if n > 0 {
			lastRecv = time.Now()
			if hb.interval > 0 && hb.piggyback(dutyAt, lastRecv) {
				if err := g.duty(d, hb, lastRecv, &dutyAt); err != nil {
					return err
				}
			}
		}
		switch {
		case err == nil:
		case hb.interval > 0 && errors.Is(err, errDeadline):
			now := time.Now()
			if err := hb.timeout(lastRecv, now); err != nil {
				return err
			}
			if hb.dutyDue(dutyAt, now) {
				if err := g.duty(d, hb, now, &dutyAt); err != nil {
					return err
				}
			}
		case g.isDead():
			return nil // closed on purpose: Close, a watchdog, or a write error
		default:
			return &Error{Code: FrameError, Reason: err.Error()}
		}
	}
}

// duty does the heartbeat duty at now (beat), and records it in dutyAt
// unless it failed.
func (g *drainGen) duty(d *drainConn, hb heartbeatClock, now time.Time, dutyAt *time.Time) *Error {
	if err := g.beat(d, hb.interval); err != nil {
		return err
	}
	*dutyAt = now
	return nil
}

// route0 routes a frame of channel 0 (route), counted first: a caller
// woken by this frame (a reply) must not take it for progress made after
// its DrainEvents began.
func (g *drainGen) route0(f frame) (stop bool, err *Error) {
	g.activity.frames.Add(1)
	return g.d.route(g, f)
}

// endedInline is false: the drainer hands nothing on that ends the
// generation on its goroutine (route stops after connection.close).
func (g *drainGen) endedInline() bool { return false }

// clock is the generation's heartbeat clock: a zero interval until tune
// has set one.
func (g *drainGen) clock() heartbeatClock {
	select {
	case <-g.beatReady:
		return heartbeatClock{time.Duration(g.interval.Load())}
	default:
		return heartbeatClock{}
	}
}

// pause waits, without reading, until users have taken enough of what is
// queued, sending heartbeats meanwhile. It reports false if the generation
// ended while paused, with the error to fail the connection with if a
// heartbeat could not be written.
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

// beat sends a heartbeat if nothing was written since the last check. It
// never waits for the write lock: a writer holding it is traffic, which
// keeps the broker's timer alive just as well. It writes straight to the
// socket, bounded by a write deadline, so that a broker that stopped
// reading costs at most one interval and never corrupts the buffered
// writer's state.
func (g *drainGen) beat(d *drainConn, interval time.Duration) *Error {
	if sent := g.sent.Load(); sent != g.lastBeat {
		g.lastBeat = sent
		return nil
	}
	c := d.c
	if !c.sendM.TryLock() {
		return nil
	}
	defer c.sendM.Unlock()
	if bw, ok := c.writer.w.(*bufio.Writer); ok && bw.Buffered() > 0 {
		return nil // a publish is between frames: traffic is flowing
	}
	nc, ok := g.conn.(net.Conn)
	if !ok {
		return nil
	}
	_ = nc.SetWriteDeadline(time.Now().Add(interval))
	n, err := nc.Write(heartbeatBytes)
	_ = nc.SetWriteDeadline(time.Time{})
	g.sent.Add(uint64(n))
	d.io.wrote(heartbeatBytes[:n]) // at a frame boundary: the buffer is empty
	g.lastBeat = g.sent.Load()
	switch {
	case err == nil:
		return nil
	case n == 0 && errors.Is(err, errDeadline):
		return nil // the broker is not reading: nothing was written, try later
	default:
		return &Error{Code: FrameError, Reason: fmt.Sprintf("writing a heartbeat: %v", err)}
	}
}

// awaitReply waits for a reply, a channel error, or the end of the
// generation (readMode.awaitReply), then looks for a reply that arrived
// before the error or end that woke it. Channel-0 replies are queued by the
// drainer itself, in frame order, and a channel error comes through the
// channel's own dispatcher, after any reply before it: either way such a
// reply is in rpc already. The end of the connection is not: connection.close,
// or a failed read, overtakes the frames that channel dispatchers have
// still to run, so a channel's caller waits (CloseTimeout at most) for them
// to have run; nothing new is read after the end.
func (d *drainConn) awaitReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error) {
	g := d.current()
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

// standInSend writes at once: nothing holds the socket across a read.
func (d *drainConn) standInSend(send func() error) error { return send() }

// nextReply only waits: the drainer reads.
func (d *drainConn) nextReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error) {
	return waitReply(ctx, errs, rpc)
}

// opened re-arms the read deadline that the end of the handshake cleared,
// so the drainer never sits in a read without a deadline once heartbeats
// are on (it may already have been in that read when the deadline went).
func (d *drainConn) opened() {
	g := d.current()
	d.countOpened()
	if nc, ok := g.conn.(net.Conn); ok {
		if interval := g.clock().interval; interval > 0 {
			_ = nc.SetReadDeadline(time.Now().Add(interval))
		}
	}
}

// flush is shutdown's flush hook: the notifications of frames read before
// the end reach their listeners before upstream's teardown sends NotifyClose
// and closes the listener chans, as upstream's reader would have handed
// them over before it saw the end. It waits until the close's deadline
// (Close's, or CloseTimeout from now after a failure); what is still
// queued then is dropped, so a listener nobody reads delays the teardown
// by that much at most.
func (d *drainConn) flush() {
	deadline, ok := d.closeDeadline()
	if !ok || !d.isCalled() {
		// A failure, or the library's own close after a protocol error
		// (which recovery may follow, with a stale deadline).
		deadline = time.Now().Add(d.opts.CloseTimeout)
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
		return ErrClosedIntentionally
	case <-g.dead:
		return d.waitErr(&g.genEnd)
	default:
	}
	err := g.activity.waitFrames(ctx, seen, g.dead, d.calledC)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errEnded):
		select {
		case <-d.calledC:
			return ErrClosedIntentionally
		default:
			return d.waitErr(&g.genEnd)
		}
	default:
		return err
	}
}

// consumerReader is nil: the drainer reads for every ConsumeFunc.
func (d *drainConn) consumerReader() consumerReader { return nil }
