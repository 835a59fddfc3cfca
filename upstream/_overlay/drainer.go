// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync"
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
// goroutine per connection holds the socket's read turn, never waiting on user code or on
// a lock held across a write, and hands notifications over in frame order; over Budget, it
// stops reading. It lends the turn to a ConsumeFunc with nothing queued, which then reads
// and runs its own deliveries itself, and takes it back when the socket goes quiet.
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
	d := &drainConn{opts: o, budget: newBudget(o.Budget, o.Budget/2)}
	d.dispatchers = map[*Channel]*chanDispatcher{}
	d.conn0.budget = d.budget
	d.init(c, d, "drainer", o.Observer, d.budget)
	d.rpcTimeout = o.RPCTimeout
	d.closeTimeout = o.CloseTimeout
	d.coalesce = o.CoalescePublishes
	d.holder = true // the drainer's goroutine; callers never read (callerRead nil)
	d.pending = &d.jobs
	d.watch = newWatcher(o, d.budget)
	d.buffers.watch = d.watch
	d.initOutbox(&d.connOut, &c.notifyM, &c.noNotify)
	d.confirmWait = func(context.Context, <-chan struct{}) error {
		if g := d.generation(); g != nil {
			g.turn.reclaim() // a lessee may be parked on the confirmation's own channel
		}
		return nil
	}
	return d
}

// drainConn is the drainer read path of one Connection, across generations.
type drainConn struct {
	readBase
	genSlot
	opts        DrainerOptions
	budget      *budget
	connOut     outbox     // connection.blocked/unblocked, in order
	jobs        workCount  // jobs queued for dispatchers (awaited by flush, replyWins)
	work        workCount  // items queued in outboxes (awaited by flush)
	mu          sync.Mutex // guards dispatchers; each dispatcher's outer lock
	dispatchers map[*Channel]*chanDispatcher
	conn0       serialQueue   // channel-0 work that may block (conn0Work)
	watch       *watcher      // warnings and the stall policy (watch.go), nil without them
	pausedFor   ListenerStats // the biggest holder when reading paused (drainer goroutine only)
}

// start runs a new generation's drainer once the previous one has exited.
func (d *drainConn) start(conn io.ReadWriteCloser) {
	g := &readGen{done: make(chan struct{})}
	d.initGen(g, conn)
	// Content being assembled is charged as pinned bytes: counted in the budget, never
	// a reason to pause, since only reading more completes it (budget.go).
	g.read.cr.budget = d.budget
	prev := d.replace(g)
	d.install(g, d.writer(g, nil))
	go d.run(g, prev)
}

// run is the drainer goroutine: it holds g's read turn (holdTurn) until g ends, and is the
// one exit that fails the connection on a read's error.
func (d *drainConn) run(g, prev *readGen) {
	defer close(g.done)
	if prev != nil {
		<-prev.done // one reader per connection, even across a recovery
	}
	before := func() (bool, *Error) { return d.pauseIfOver(g) }
	err := d.holdTurn(g, before)
	g.read.cr.release() // content cut short by the generation's end, before the teardown
	if err != nil {
		d.fail(g, err)
	}
}

// fill is the drainer's read: nothing else reads or cuts it short but Close, opened and the
// watchdog, so it only sets the deadline when it changed.
//
// Before a read that blocks its thread in the kernel (drainer.BlockingDialer's), the holder
// lets the goroutines that its last frames readied, a Consume chan's receiver, run on this
// thread first. Else they wait in this P's run queue until sysmon takes the P from the
// blocked thread and wakes another thread for them: a context switch per burst of
// deliveries (issue #40's drain: 0.61 per delivery, 0.55 with the yield). A lessee, a
// ConsumeFunc that reads for itself, readied nobody: it would only give its thread away.
func (d *drainConn) fill(g *readGen, deadline time.Time, _ context.Context) (int, error) {
	g.read.setReadDeadline(deadline)
	if g.read.blocksThread && !g.turn.lent.Load() {
		runtime.Gosched()
	}
	return g.read.split.fill(g.conn)
}

// pauseIfOver stops reading while the budget is over, until users took enough (TCP
// backpressure instead of unbounded buffers), still beating; stop once g ended.
func (d *drainConn) pauseIfOver(g *readGen) (stop bool, err *Error) {
	over, below := d.budget.over()
	if !over {
		return false, nil
	}
	if resumed, err := d.pause(g, below, g.clock().interval); !resumed {
		return true, err
	}
	g.read.lastRecv = time.Now() // a pause we chose is not a silent broker
	return false, nil
}

// pause waits, beating, until users took enough; false once g ended.
func (d *drainConn) pause(g *readGen, below <-chan struct{},
	interval time.Duration) (resumed bool, err *Error) {
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
		case now := <-tick:
			if err := d.duty(g, interval, now); err != nil {
				return false, err
			}
		}
	}
}

// standInSend sends at once: nothing holds the socket across a read.
func (d *drainConn) standInSend(send func() error) error { return send() }

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
