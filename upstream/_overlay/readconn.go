// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosedIntentionally is returned, in the drainer and legacy modes (upstream mode returns
// ErrClosed), to waiters on a connection (an RPC, DrainEvents) the application closed with
// Close. errors.Is(err, ErrClosed) holds; it is not Recoverable, so nothing reconnects.
var ErrClosedIntentionally error = closedIntentionally{}

type closedIntentionally struct{}

func (closedIntentionally) Error() string {
	return "amqp: connection closed intentionally by the application"
}

// Unwrap makes errors.Is(err, ErrClosed) hold.
func (closedIntentionally) Unwrap() error { return ErrClosed }

// Recoverable is always false: a deliberate close must not be retried.
func (closedIntentionally) Recoverable() bool { return false }

const (
	defaultCloseTimeout = 5 * time.Second // the options' CloseTimeout when zero
	// connRPCCap is how many channel-0 replies are buffered, so that their router never
	// waits for a caller (replyOverflow); chanRPCCap likewise on a channel.
	connRPCCap = 8
	chanRPCCap = 8
	// frameCost is charged to the budget per queued frame or notification, on top of its
	// payload, so that many empty frames still count.
	frameCost = 64
	// deadAfter is how many heartbeat intervals of silence mean a dead broker: 1.5
	// heartbeats, as upstream's reader judges.
	deadAfter = 3
)

var errDeadline = os.ErrDeadlineExceeded // matches a read or write that ended at its deadline

// readBase is what a read path fixes at attach and both modes keep alike; after attach,
// its fields change only through its methods.
type readBase struct {
	c            *Connection
	mode         readMode      // what the mode does its own way (readgen.go)
	name         string        // the ReadMode
	rpcCap       int           // the capacity of each channel's rpc chan (upstream: 0)
	rpcTimeout   time.Duration // the options' RPCTimeout
	closeTimeout time.Duration // the options' CloseTimeout
	deliveries   *budget       // what consumer buffers count against (legacy never pauses)
	confirmWait  confirmPump   // for DeferredConfirmation.Wait (readpath.go's confirmPump)
	closeIntent                // Close was called: waiters get ErrClosedIntentionally
	blocks       blockGate
	pub          publishOut    // the generation's socket writer, under c.sendM (publish.go)
	group        writeGroup    // publishes written together (groupcommit.go)
	coalesce     bool          // the options' CoalescePublishes
	io           ioCounters    // bytes and frames, for Stats
	buffers      bufferSet     // consumer buffers, for Stats
	clocks       confirmClocks // confirm clocks, for ConfirmInfo.Latency
	obs          *Observer     // the options' Observer
	gens         atomic.Int32  // generations opened, for ConnectionRecovered
	// Who takes the read turn (readTurn). holder: a goroutine holds it by default and lends
	// it (the drainer's, AutoDrain's). callerRead: how a caller holding the turn reads until
	// a frame is routed, or nil where callers never read (the drainer: its holder reads
	// for them). inline: frames are dispatched on the turn holder, as upstream's reader
	// dispatches them (legacy), not queued for dispatchers.
	holder     bool
	callerRead func(ctx context.Context, g *readGen, consumer bool) error
	inline     bool
	pending    *workCount // the drainer's jobs not yet run, which a reply may wait behind
}

// init fixes the parts of a read path being attached to c.
func (b *readBase) init(c *Connection, mode readMode, name string, obs *Observer,
	deliveries *budget) {
	b.c = c
	b.mode = mode
	b.name = name
	b.rpcCap = chanRPCCap
	b.deliveries = deliveries
	b.closeIntent = newCloseIntent()
	b.obs = obs
	b.clocks.m = map[uint16]*confirmClock{}
	if obs != nil {
		b.io.settled = obs.Settled
	}
}

// base gives the seam the read path's fixed parts (readPath.base).
func (b *readBase) base() *readBase { return b }

// genEnd is how a generation ends, and why.
//
// One end for every waiter: Close, a failed read, a heartbeat timeout, the watchdog and an
// abandoned call may all try to end a generation, and only the first decides its error
// (setDead, under once). dead is closed after err is written, so a waiter that saw dead
// closed reads the final err without a lock.
type genEnd struct {
	once     sync.Once
	dead     chan struct{} // closed once, releasing every waiter
	err      *Error        // why it ended; nil for an intentional close
	reported atomic.Bool   // the Observer has heard of the end (observeEnd)
}

func newGenEnd() genEnd { return genEnd{dead: make(chan struct{})} }

// setDead ends the generation with err, reporting whether this call did.
func (e *genEnd) setDead(err *Error) (first bool) {
	e.once.Do(func() { e.err = err; close(e.dead); first = true })
	return first
}

// explain returns, for a failed write, why the generation ended if it did:
// "close-ok not received within 5s", not "use of closed network connection".
func (e *genEnd) explain(err error) error {
	if err == nil || !e.isDead() || e.err == nil {
		return err
	}
	return e.err
}

func (e *genEnd) isDead() bool { return isClosing(e.dead) }

// readGen is one connection generation: one socket, its read turn, and how it ends.
type readGen struct {
	conn        io.ReadWriteCloser
	rpc         chan message  // the generation's c.rpc: channel-0 replies
	genEnd                    // how the generation ends
	turn        readTurn      // who may read (readturn.go)
	read        readState     // the turn holder's read state (readstep.go)
	activity    activity      // frames routed, waking DrainEvents callers
	interval    atomic.Int64  // heartbeat send interval in ns, 0 until tune (or none)
	sent        atomic.Uint64 // bytes written by anyone: the heartbeat duty's "traffic"
	opened      atomic.Bool   // the handshake is done (opened)
	handshakeBy time.Time     // legacy: the handshake's bound, as upstream's dial sets it
	done        chan struct{} // drainer: closed when its goroutine has returned; nil in legacy
}

// initGen readies g, a new generation for conn, for its first read step.
func (b *readBase) initGen(g *readGen, conn io.ReadWriteCloser) {
	g.conn = conn
	g.rpc = make(chan message, connRPCCap)
	g.genEnd = newGenEnd()
	g.turn = newReadTurn()
	g.read.split = newFrameSplitter(&b.c.maxFrameSize)
	g.read.split.counts = &b.io
	g.read.cr = &contentReader{asms: map[uint16]*contentAsm{}}
	g.read.nc, _ = conn.(net.Conn)
	g.read.blocksThread = readsBlockThread(conn)
}

// threadReader is a socket whose reads block their OS thread in the kernel instead of
// parking a goroutine on the network poller: drainer.BlockingDialer's.
type threadReader interface{ ReadBlocksThread() }

// readsBlockThread reports whether conn, or the socket under its TLS, is a threadReader.
func readsBlockThread(conn io.ReadWriteCloser) bool {
	if tc, ok := conn.(interface{ NetConn() net.Conn }); ok {
		conn = tc.NetConn()
	}
	_, ok := conn.(threadReader)
	return ok
}

// clock is the heartbeat clock: a zero interval until tune has set one.
func (g *readGen) clock() heartbeatClock {
	return heartbeatClock{time.Duration(g.interval.Load())}
}

// writer is the generation's socket writer, with guard (legacy's transport lock) or nil.
func (b *readBase) writer(g *readGen, guard *transportGuard) *socketWriter {
	vectors, _ := g.conn.(vectorWriter)
	return &socketWriter{conn: g.conn, vectors: vectors, end: &g.genEnd, counts: &b.io, sent: &g.sent,
		guard: guard}
}

// interrupt cuts short a read in progress with a deadline of now. Its reader sees a
// deadline error, which the read step takes as one of its own (ownsDeadline), and sets
// its deadline anew at the next step.
func (g *readGen) interrupt() {
	if nc, ok := g.conn.(net.Conn); ok {
		_ = nc.SetReadDeadline(time.Now())
	}
}

// install makes w the writer behind c.writer and publishes, and g.rpc
// c.rpc; the new socket starts unblocked. Takes c.sendM, then c.m.
//
// Why under c.sendM: a publish or a heartbeat that holds it writes through c.writer,
// and must not see the writer change mid-frame. A new generation's writer replaces the
// last one only once nobody writes through the old one; the old socket is closed by
// then, so any late write there fails and is explained by the old generation's end.
func (b *readBase) install(g *readGen, w *socketWriter) {
	b.blocks.unblock()
	b.c.sendM.Lock()
	b.io.restart()
	b.pub.buf, b.pub.out = bufio.NewWriter(w), w
	b.c.writer = &writer{b.pub.buf}
	b.c.sendM.Unlock()
	b.c.m.Lock()
	b.c.rpc = g.rpc
	b.c.m.Unlock()
}

// fail ends g with err: IsClosed is true before waiters are released, then
// the socket is closed (freeing writers), then upstream's teardown runs.
//
// The order matters. A waiter released by the end may look at IsClosed at once, and
// must see true, as upstream's callers do after its shutdown. The socket is closed before
// upstream's shutdown takes its locks, because a publisher blocked in a write holds
// ch.m and c.sendM, which the shutdown needs: closing the socket frees it.
func (b *readBase) fail(g *readGen, err *Error) {
	b.c.closed.Store(true)
	if !g.setDead(err) {
		return // Close or another failure was first
	}
	_ = g.conn.Close()
	b.c.shutdown(err)
}

// countOpened counts a generation whose handshake completed, and reports it to the Observer.
func (b *readBase) countOpened() {
	kind := ConnectionOpened
	if b.gens.Add(1) > 1 {
		kind = ConnectionRecovered
	}
	if b.obs != nil && b.obs.Connection != nil {
		b.obs.Connection(ConnectionEvent{Kind: kind, Mode: b.name})
	}
}

// socketWriter writes a generation's socket, counting, and explains failures. It is the
// one writer of both modes: every frame, publish and heartbeat goes through it, so Stats
// counts every byte, the heartbeat duty sees every write (sent), and legacy's transport
// guard is taken around every write.
type socketWriter struct {
	conn    io.Writer
	vectors vectorWriter // conn's own writev, if it has one; found once, not per publish
	end     *genEnd
	counts  *ioCounters     // the connection's, for Stats
	sent    *atomic.Uint64  // the generation's bytes written, for the heartbeat duty
	guard   *transportGuard // if not nil, held around each write: legacy's transport lock
}

func (w *socketWriter) Write(p []byte) (int, error) {
	if w.guard != nil {
		w.guard.lock()
		defer w.guard.unlock()
	}
	n, err := w.conn.Write(p)
	w.counts.writes.Add(1)
	w.counts.wrote(p[:n])
	w.sent.Add(uint64(n))
	return n, w.end.explain(err)
}

// vectorWriter is a socket with a writev of its own: drainer.BlockingDialer's, which
// net.Buffers.WriteTo would write with a write(2) per buffer, since only the net
// package's sockets have its vectored path.
type vectorWriter interface {
	WriteBuffers(v *net.Buffers) (int64, error)
}

// writeVectors is Write for a publish's buffers: one writev on a socket.
func (w *socketWriter) writeVectors(v *net.Buffers) (int64, error) {
	if w.guard != nil {
		w.guard.lock()
		defer w.guard.unlock()
	}
	w.counts.writingVectors(*v)
	var n int64
	var err error
	if w.vectors != nil {
		n, err = w.vectors.WriteBuffers(v)
	} else {
		n, err = v.WriteTo(w.conn)
	}
	w.counts.writes.Add(1)
	w.counts.bytesOut.Add(uint64(n))
	w.sent.Add(uint64(n))
	return n, w.end.explain(err)
}
