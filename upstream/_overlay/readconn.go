// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

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

// What the two read modes share, besides a generation's life (readgen.go).
//
// The drainer (drainer.go) and legacy mode (legacy.go) each read the
// socket their own way (a goroutine of the connection's, or whoever calls
// in), and share what is here: the state a read path fixes when it is
// attached (readBase), a connection generation (readGen), its install and
// failure, the socket writer, the channel-frame path from raw bytes to
// what a channel's dispatch takes, and the heartbeat clock.

// ErrClosedIntentionally is returned to goroutines that were waiting on a
// connection (an RPC, DrainEvents) when the application closed it with
// Close. errors.Is(err, ErrClosed) is true for it, and it is not
// Recoverable, so neither automatic recovery nor a retry loop that checks
// Recoverable reconnects after a deliberate shutdown. The drainer and
// legacy modes return it; upstream mode returns ErrClosed, as upstream.
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
	// defaultCloseTimeout is DrainerOptions.CloseTimeout and
	// LegacyOptions.CloseTimeout when they are zero.
	defaultCloseTimeout = 5 * time.Second
	// connRPCCap buffers channel-0 replies, so that their dispatcher never
	// waits for a caller to take one (replyOverflow).
	connRPCCap = 8
	// chanRPCCap buffers channel replies for the same reason.
	chanRPCCap = 8
	// frameCost is what one queued frame or notification is charged on top
	// of its payload: its bookkeeping, roughly.
	frameCost = 64
)

// errDeadline matches a read or write that ended at its deadline.
var errDeadline = os.ErrDeadlineExceeded

// readBase is what a read path fixes when it is attached to a Connection
// (attach), for the Connection's whole life, plus the parts both read modes
// keep alike. The seam's hooks read its fields directly (readPath.base):
// none changes after attach, except through its own methods.
type readBase struct {
	c            *Connection
	mode         readMode      // what the mode does its own way (readgen.go)
	name         string        // the ReadMode
	rpcCap       int           // the capacity of each channel's rpc chan (upstream: 0)
	rpcTimeout   time.Duration // the options' RPCTimeout
	closeTimeout time.Duration // the options' CloseTimeout

	// deliveries is the budget that consumer buffers count against: the
	// drainer's, or one legacy counts on and never pauses for.
	deliveries *budget
	// confirmWait reads frames for DeferredConfirmation.Wait in a mode where
	// nobody else does (legacy), nil otherwise.
	confirmWait confirmPump

	closeIntent // Close was called: waiters get ErrClosedIntentionally
	blocks      blockGate
	pub         publishOut // the generation's socket writer, under c.sendM (publish.go)
	group       writeGroup // publishes written together (groupcommit.go)
	coalesce    bool       // the options' CoalescePublishes

	io      ioCounters    // bytes and frames, for Stats
	buffers bufferSet     // consumer buffers, for Stats
	clocks  confirmClocks // confirm clocks, for ConfirmInfo.Latency
	obs     *Observer     // the options' Observer
	gens    atomic.Int32  // generations opened, for ConnectionRecovered
}

// init fixes the parts of a read path being attached to c.
func (b *readBase) init(c *Connection, mode readMode, name string, obs *Observer, deliveries *budget) {
	b.c, b.mode, b.name, b.rpcCap = c, mode, name, chanRPCCap
	b.deliveries = deliveries
	b.closeIntent = newCloseIntent()
	b.obs = obs
	if obs != nil {
		b.io.settled = obs.Settled
	}
}

// base gives the seam the read path's fixed parts (readPath.base).
func (b *readBase) base() *readBase { return b }

// clockOf is channel id's confirm clock, or nil unless the Observer has
// a Confirmed hook.
func (b *readBase) clockOf(id uint16) *confirmClock { return b.clocks.clock(b.obs, id) }

// genEnd is how one connection generation ends, for the read modes: a chan
// closed exactly once, which releases every waiter together, and why.
type genEnd struct {
	once sync.Once
	dead chan struct{}
	err  *Error // why it ended; nil for an intentional close

	reported atomic.Bool // the Observer has heard of the end (observeEnd)
}

func newGenEnd() genEnd { return genEnd{dead: make(chan struct{})} }

// setDead ends the generation with err, if it has not ended yet, and
// reports whether this call ended it.
func (e *genEnd) setDead(err *Error) bool {
	first := false
	e.once.Do(func() {
		e.err = err
		close(e.dead)
		first = true
	})
	return first
}

// explain returns why the generation ended in place of err, a failed
// socket write, when the end is what broke the socket: the Close watchdog
// or a failed read closed it under the writer. A publisher, or Close
// itself, then learns the cause ("close-ok not received within 5s") rather
// than "use of closed network connection".
func (e *genEnd) explain(err error) error {
	if err == nil || !e.isDead() || e.err == nil {
		return err
	}
	return e.err
}

func (e *genEnd) isDead() bool {
	select {
	case <-e.dead:
		return true
	default:
		return false
	}
}

// readGen is one connection generation of a read mode: one socket, and how
// it ends.
type readGen struct {
	conn io.ReadWriteCloser
	rpc  chan message // the generation's c.rpc: channel-0 replies

	genEnd // how the generation ends
}

func newReadGen(conn io.ReadWriteCloser) readGen {
	return readGen{conn: conn, rpc: make(chan message, connRPCCap), genEnd: newGenEnd()}
}

// interrupt cuts short a read of the generation's socket in progress, if
// the socket has read deadlines. Legacy mode uses it: each of its reads
// sets its own deadline first, so a read that starts later is not
// affected.
func (g *readGen) interrupt() {
	if nc, ok := g.conn.(net.Conn); ok {
		_ = nc.SetReadDeadline(time.Now())
	}
}

// install makes g the connection's generation for writers and channel-0
// callers: w becomes the socket writer behind c.writer and the publish
// fast path, and g.rpc the chan of connection-level replies. The new
// socket is one the broker has not blocked.
func (b *readBase) install(g *readGen, w *socketWriter) {
	b.blocks.unblock()
	c := b.c
	c.sendM.Lock()
	b.io.restart()
	b.pub.buf, b.pub.out = bufio.NewWriter(w), w
	c.writer = &writer{b.pub.buf}
	c.sendM.Unlock()
	c.m.Lock()
	c.rpc = g.rpc
	c.m.Unlock()
}

// fail ends generation g because of err, from the goroutine that found the
// error: waiters are released first, then the socket is closed (freeing
// writers), then upstream's teardown runs.
func (b *readBase) fail(g *readGen, err *Error) {
	// Waiters released below may look at IsClosed at once: it must be true.
	b.c.closed.Store(true)
	if !g.setDead(err) {
		return // Close or another failure got there first
	}
	_ = g.conn.Close()
	b.c.shutdown(err)
}

// countOpened counts a generation whose handshake completed, for the Observer.
func (b *readBase) countOpened() { observeOpened(b.obs, b.name, b.gens.Add(1)) }

// socketWriter is a generation's writer of the socket. It counts what
// goes out (Stats; the heartbeat's idea of traffic, through sent), and
// reports a write that failed because the generation ended by why it
// ended (genEnd.explain).
type socketWriter struct {
	conn   io.Writer
	end    *genEnd
	counts *ioCounters // the connection's, for Stats
	// sent runs after each write that sent n > 0 bytes.
	sent func(n int64)
	// guard, if not nil, is taken around each write: legacy mode's
	// transport lock.
	guard interface {
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

// writeVectors is Write for a publish's buffers (publish.go): one writev
// on a TCP or Unix socket, a Write per buffer on other writers.
func (w *socketWriter) writeVectors(v *net.Buffers) (int64, error) {
	if w.guard != nil {
		w.guard.lock()
		defer w.guard.unlock()
	}
	w.counts.writingVectors(*v)
	n, err := v.WriteTo(w.conn)
	w.counts.writes.Add(1)
	w.counts.wroteBytes(n)
	if n > 0 {
		w.sent(n)
	}
	return n, w.end.explain(err)
}

// chanStep is what one frame of a channel other than 0 comes to, once
// decoded and fed to its channel's content assembly (fastread.go): at most
// one of the fields after ch is set, and none while content is incomplete.
type chanStep struct {
	ch     *Channel           // nil: the channel is not open
	closed frame              // a method on a channel that is not open, as upstream parsed it
	method *methodFrame       // a method that starts no content
	del    *Delivery          // a complete basic.deliver from the fast path
	msg    messageWithContent // any other complete content message
}

// channelFrame is the channel-frame path of both read modes, upstream's
// dispatchN up to the channel's dispatch: raw, a complete frame on channel
// id ≠ 0, is decoded (fast where it can be), the channel looked up and
// updated as upstream's reader does, and content assembled, so that a
// channel's dispatch only ever sees methods that start no content and
// complete messages. Content for a channel that is not open is dropped;
// a method for one comes back in closed, for upstream's dispatchClosed.
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
	if !ok {
		Logger.Printf("[debug] dropping frame, channel %d does not exist", id)
		var step chanStep
		if raw[0] == frameMethod {
			step.closed = cf.upstreamFrame(split, raw)
		}
		return step, nil
	}
	step := chanStep{ch: ch}
	a := cr.asm(id, ch)
	complete, method := cr.feed(a, &cf, c.maxFrameSize.Load())
	switch {
	case method != nil:
		step.method = method
	case complete:
		step.del, step.msg = a.complete()
	}
	return step, nil
}

// heartbeatClock is the heartbeat arithmetic of a generation, as pure
// functions of its send interval (half the negotiated heartbeat, as
// upstream sends; 0 for no heartbeats) and the times each mode keeps.
type heartbeatClock struct{ interval time.Duration }

// deadAfter is the silence, in send intervals, after which the broker is
// declared dead: 1.5 × the negotiated heartbeat, as upstream's reader.
const deadAfter = 3

// deadline is when a broker last heard from at lastRecv is declared dead.
func (h heartbeatClock) deadline(lastRecv time.Time) time.Time {
	return lastRecv.Add(deadAfter * h.interval)
}

// timeout returns the error to fail the connection with when the broker
// has been silent since lastRecv for deadAfter intervals at now, else nil.
func (h heartbeatClock) timeout(lastRecv, now time.Time) *Error {
	silent := now.Sub(lastRecv)
	if h.interval <= 0 || silent < deadAfter*h.interval {
		return nil
	}
	return &Error{Code: FrameError, Reason: fmt.Sprintf(
		"heartbeat timeout: no frame from the broker for %s (heartbeat %s)",
		silent.Round(time.Millisecond), 2*h.interval)}
}

// window is the longest the drainer lets pass between heartbeat duties
// when no frame wakes it: one and a half send intervals, so that the
// broker's frames, which arrive once per interval, usually carry the duty
// first, and still well inside the two heartbeats after which the broker
// gives up on us.
func (h heartbeatClock) window() time.Duration { return h.interval + h.interval/2 }

// readDeadline is when the drainer's read must end: when the broker is
// dead, or when the duty done at dutyAt is due again, whichever is first.
func (h heartbeatClock) readDeadline(lastRecv, dutyAt time.Time) time.Time {
	deadline := h.deadline(lastRecv)
	if latest := dutyAt.Add(h.window()); latest.Before(deadline) {
		return latest
	}
	return deadline
}

// dutyDue reports whether the drainer, woken by its read deadline at now,
// owes the heartbeat duty it last did at dutyAt.
func (h heartbeatClock) dutyDue(dutyAt, now time.Time) bool { return now.Sub(dutyAt) >= h.window() }

// piggyback reports whether a frame received at now, with the duty last
// done at dutyAt, should carry the duty: once half an interval has passed,
// the drainer does it while awake anyway, so that idle, the broker's own
// heartbeats carry ours and the deadline never fires (one wake-up per
// interval instead of two).
func (h heartbeatClock) piggyback(dutyAt, now time.Time) bool {
	return !dutyAt.IsZero() && now.Sub(dutyAt) >= h.interval/2
}

// sendDue reports whether legacy mode, which writes whenever the
// application calls in, owes the broker a heartbeat: nothing written for
// an interval.
func (h heartbeatClock) sendDue(lastSent, now time.Time) bool {
	return now.Sub(lastSent) >= h.interval
}
