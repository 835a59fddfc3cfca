// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bufio"
	"fmt"
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
	connRPCCap          = 8               // channel-0 replies buffered, so their dispatcher never waits (replyOverflow)
	chanRPCCap          = 8               // channel replies, likewise
	frameCost           = 64              // charged per queued frame or notification, on top of its payload
	deadAfter           = 3               // heartbeat intervals of silence that mean a dead broker (1.5 heartbeats, as upstream)
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
	confirmWait  confirmPump   // for DeferredConfirmation.Wait: legacy reads, the drainer reclaims its turn
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
}

// init fixes the parts of a read path being attached to c.
func (b *readBase) init(c *Connection, mode readMode, name string, obs *Observer, deliveries *budget) {
	b.c, b.mode, b.name, b.rpcCap, b.deliveries = c, mode, name, chanRPCCap, deliveries
	b.closeIntent, b.obs = newCloseIntent(), obs
	if obs != nil {
		b.io.settled = obs.Settled
	}
}

// base gives the seam the read path's fixed parts (readPath.base).
func (b *readBase) base() *readBase { return b }

// genEnd is how a generation ends, and why.
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

// readGen is one connection generation: one socket, and how it ends.
type readGen struct {
	conn   io.ReadWriteCloser
	rpc    chan message // the generation's c.rpc: channel-0 replies
	genEnd              // how the generation ends
}

func newReadGen(conn io.ReadWriteCloser) readGen {
	return readGen{conn: conn, rpc: make(chan message, connRPCCap), genEnd: newGenEnd()}
}

// interrupt cuts short a read in progress (legacy's reads set their own deadline).
func (g *readGen) interrupt() {
	if nc, ok := g.conn.(net.Conn); ok {
		_ = nc.SetReadDeadline(time.Now())
	}
}

// install makes w the writer behind c.writer and publishes, and g.rpc
// c.rpc; the new socket starts unblocked. Takes c.sendM, then c.m.
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
func (b *readBase) fail(g *readGen, err *Error) {
	if b.c.closed.Store(true); g.setDead(err) { // else Close or another failure was first
		_ = g.conn.Close()
		b.c.shutdown(err)
	}
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

// socketWriter writes a generation's socket, counting, and explains failures.
type socketWriter struct {
	conn   io.Writer
	end    *genEnd
	counts *ioCounters   // the connection's, for Stats
	sent   func(n int64) // runs after each write of n > 0 bytes
	guard  interface {   // if not nil, held around each write: legacy's transport lock
		lock()
		unlock()
	}
}

func (w *socketWriter) Write(p []byte) (int, error) {
	if w.guard != nil {
		w.guard.lock()
		defer w.guard.unlock()
	}
	n, err := w.conn.Write(p)
	w.counts.writes.Add(1)
	w.counts.wrote(p[:n])
	if n > 0 {
		w.sent(int64(n))
	}
	return n, w.end.explain(err)
}

// writeVectors is Write for a publish's buffers: one writev on a socket.
func (w *socketWriter) writeVectors(v *net.Buffers) (int64, error) {
	if w.guard != nil {
		w.guard.lock()
		defer w.guard.unlock()
	}
	w.counts.writingVectors(*v)
	n, err := v.WriteTo(w.conn)
	w.counts.writes.Add(1)
	w.counts.bytesOut.Add(uint64(n))
	if n > 0 {
		w.sent(n)
	}
	return n, w.end.explain(err)
}

// chanStep is what a frame on channel ≠ 0 comes to: at most one field after ch.
type chanStep struct {
	ch     *Channel           // nil: the channel is not open
	closed frame              // a method for a channel not open, as upstream parsed it
	method *methodFrame       // a method that starts no content
	del    *Delivery          // a complete basic.deliver from the fast path
	msg    messageWithContent // any other complete content message
}

// channelFrame is upstream's dispatchN up to the channel's dispatch, for raw on channel
// id ≠ 0: a dispatch sees only whole messages and methods that start no content.
func (cr *contentReader) channelFrame(c *Connection, split *frameSplitter, id uint16, raw []byte) (chanStep, *Error) {
	cf, err := cr.decode(split, raw)
	if err != nil {
		return chanStep{}, &Error{Code: FrameError, Reason: fmt.Sprintf("malformed frame: %v", err)}
	}
	c.m.Lock()
	ch, ok := c.channels[id]
	if ok && cf.f != nil {
		updateChannel(cf.f, ch)
	}
	c.m.Unlock()
	step := chanStep{ch: ch}
	if !ok {
		Logger.Printf("[debug] dropping frame, channel %d does not exist", id)
		if raw[0] == frameMethod {
			if step.closed = cf.f; cf.f == nil { // decoded fast: upstream's parse succeeds too
				step.closed, _ = split.parse(raw)
			}
		}
		return step, nil
	}
	a := cr.asm(id, ch)
	var complete bool // never with a method
	if complete, step.method = cr.feed(a, &cf, c.maxFrameSize.Load()); complete {
		step.del, step.msg = a.complete()
	}
	return step, nil
}

// heartbeatClock does heartbeat arithmetic on the send interval (half the heartbeat; 0: none).
type heartbeatClock struct{ interval time.Duration }

// timeout returns the error to fail with if the broker is dead at now, else nil.
func (h heartbeatClock) timeout(lastRecv, now time.Time) *Error {
	if silent := now.Sub(lastRecv); h.interval > 0 && silent >= deadAfter*h.interval {
		return &Error{Code: FrameError, Reason: fmt.Sprintf("heartbeat timeout: no frame from the broker for %s (heartbeat %s)",
			silent.Round(time.Millisecond), 2*h.interval)}
	}
	return nil
}

// window is the most between the drainer's duties (the broker's frames usually carry
// them); readDeadline is the broker's death or the next duty, whichever is first.
func (h heartbeatClock) window() time.Duration { return h.interval + h.interval/2 }
func (h heartbeatClock) readDeadline(lastRecv, dutyAt time.Time) time.Time {
	deadline := lastRecv.Add(deadAfter * h.interval) // the broker's death
	if latest := dutyAt.Add(h.window()); latest.Before(deadline) {
		return latest
	}
	return deadline
}

// dutyDue reports whether the duty last done at dutyAt is owed at now.
func (h heartbeatClock) dutyDue(dutyAt, now time.Time) bool { return now.Sub(dutyAt) >= h.window() }

// piggyback reports whether a frame at now carries the duty (idle: one wake-up an interval).
func (h heartbeatClock) piggyback(dutyAt, now time.Time) bool {
	return !dutyAt.IsZero() && now.Sub(dutyAt) >= h.interval/2
}

// sendDue reports whether legacy mode, silent for an interval, owes a heartbeat.
func (h heartbeatClock) sendDue(lastSent, now time.Time) bool { return now.Sub(lastSent) >= h.interval }
