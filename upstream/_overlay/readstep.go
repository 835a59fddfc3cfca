// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"
)

// The read step: the one place where a generation's socket is read, in both modes.
//
// Whoever holds the generation's read turn (readturn.go) reads by calling readStep: the
// drainer's goroutine or AutoDrain's, a ConsumeFunc they lent the turn to, or in legacy
// mode a caller that took the turn (an RPC's or a confirmation's wait, DrainEvents, a
// ConsumeFunc). A step:
//
//  1. picks the read's deadline: the broker's death or the next heartbeat duty
//     (heartbeatClock), capped by the reader's own limits (stepLimits);
//  2. reads once, through the mode's fill (legacy's takes its transport lock there);
//  3. keeps the heartbeat duty: a read that brought bytes carries it now and then, and a
//     read that hit its deadline checks that the broker lives and sends a heartbeat if
//     nothing else was written since the last duty;
//  4. routes every frame that is now complete (routeFrames).
//
// Upstream does the same with two goroutines, reader and heartbeater, and a read deadline
// that only the handshake sets. One step does both here because the turn holder is the
// only one who knows when the socket last spoke, and because a heartbeat sent from the
// read side needs no goroutine of its own.

// readState is what the read turn's holder keeps from one step to the next. It has no
// lock: the turn is its lock (readTurn says why that is safe).
type readState struct {
	split    *frameSplitter
	cr       *contentReader
	nc       net.Conn  // the socket, if it is one: only a net.Conn takes read deadlines
	lastRecv time.Time // the last read that brought bytes, or reading resumed after a gap
	readEnd  time.Time // the last read's end: a longer gap than an interval means nobody read
	dutyAt   time.Time // the last heartbeat duty (heartbeatClock)
	lastBeat uint64    // readGen.sent at the last duty: unchanged means nothing was written
	rdl      time.Time // the read deadline as last set by setReadDeadline
	// rdlStale: a deadline passed (ours, or one set by another to interrupt the read), so
	// the socket's deadline is no longer rdl and must be set at the next step, even to
	// zero. Until then rdl is trusted: a generation starts with the dialler's deadline,
	// the handshake's bound, which only a passed deadline may replace.
	rdlStale bool
	// hookFirst: legacy's fill hooks ctx to the read at once, because frames come slower
	// than cancelHookDelay (legacy.go).
	hookFirst bool
	// blocksThread: the socket's reads block their thread in the kernel (threadReader), so
	// the drainer's holder yields before each (drainConn.fill).
	blocksThread bool
}

// stepLimits are what a reader adds to the heartbeat's deadline.
type stepLimits struct {
	ctx   context.Context // legacy: the caller's, whose end cuts the read short; nil: none
	until time.Time       // the latest the read may wait (ctx's deadline, the handshake's)
	quiet time.Duration   // a lessee's: give the turn back after this long with nothing read
}

// stepResult is what one step did.
type stepResult struct {
	routed int  // frames routed
	idle   bool // the read ended at a deadline or was cut short, bringing nothing
	stop   bool // reading ends; err is why, nil after connection.close or an end on purpose
	err    *Error
}

// errCutShort is a mode's fill's report that it gave its read up to a writer before
// reading (legacy's transport guard): nothing was read, and the step is idle.
var errCutShort = errors.New("amqp: read cut short")

// readStep reads once and routes what is complete, the turn held.
//
// A read that brought bytes and failed (a reset after the last frame) fails the step
// before its frames are routed, as upstream's reader fails on the read's error; the
// frames were the broker's last, and the connection's end tells the same to everyone.
func (b *readBase) readStep(g *readGen, lim stepLimits) stepResult {
	rs := &g.read
	hb := g.clock()
	deadline := rs.deadline(hb, lim)
	n, rerr := b.mode.fill(g, deadline, lim.ctx)
	res := stepResult{idle: n == 0}
	if n > 0 {
		rs.lastRecv = time.Now()
		rs.readEnd = rs.lastRecv
		if hb.interval > 0 && hb.piggyback(rs.dutyAt, rs.lastRecv) {
			res.err = b.duty(g, hb.interval, rs.lastRecv)
		}
	}
	switch {
	case res.err != nil: // the heartbeat's write failed
	case rerr == nil:
	case errors.Is(rerr, errCutShort):
	case errors.Is(rerr, errDeadline) && b.ownsDeadline(g, deadline):
		res.err = b.deadlinePassed(g, hb, rerr)
	case g.isDead():
		res.stop = true // closed on purpose: Close, a watchdog, a write error, a failure
		return res
	default:
		res.err = &Error{Code: FrameError, Reason: rerr.Error()}
	}
	if res.err != nil {
		res.stop = true
		return res
	}
	res.routed, res.stop, res.err = b.routeFrames(g)
	return res
}

// ownsDeadline reports whether a read that ended at a deadline ended at one of ours: one
// this step set, or (once the handshake is done, and always in legacy, whose reads are
// cut short by writers and Close) one set to interrupt it. Before the handshake's end a
// deadline the step did not set is the dialler's, the handshake's bound, and fails the
// read as upstream's reader fails.
func (b *readBase) ownsDeadline(g *readGen, deadline time.Time) bool {
	return !deadline.IsZero() || g.opened.Load() || b.inline
}

// deadlinePassed does a read's deadline's duties: the broker's death, the handshake's
// bound, and a heartbeat owed. A non-nil error ends reading.
func (b *readBase) deadlinePassed(g *readGen, hb heartbeatClock, rerr error) *Error {
	rs := &g.read
	rs.rdl = time.Time{} // passed, or set by another to interrupt: set it anew next step
	rs.rdlStale = true
	now := time.Now()
	rs.readEnd = now
	if err := hb.timeout(rs.lastRecv, now); err != nil {
		return err
	}
	if !g.opened.Load() && !g.handshakeBy.IsZero() && !now.Before(g.handshakeBy) {
		return &Error{Code: FrameError, Reason: rerr.Error()} // as upstream's reader
	}
	if hb.interval > 0 && hb.dutyDue(rs.dutyAt, now) {
		return b.duty(g, hb.interval, now)
	}
	return nil
}

// deadline is the read's deadline: the heartbeat's, capped by lim; zero: none. After a
// gap with nobody reading (legacy's callers read when they like, the drainer may pause)
// the broker's frames wait in the buffer, so its silence counts from now.
func (rs *readState) deadline(hb heartbeatClock, lim stepLimits) time.Time {
	var deadline time.Time
	if hb.interval > 0 {
		now := time.Now()
		if now.Sub(rs.readEnd) > hb.interval {
			rs.lastRecv = now
		}
		if rs.dutyAt.IsZero() {
			rs.dutyAt = now
		}
		deadline = hb.readDeadline(rs.lastRecv, rs.dutyAt)
	}
	deadline = earliest(deadline, lim.until)
	if lim.quiet > 0 {
		deadline = rs.quietCap(deadline, lim.quiet)
	}
	return deadline
}

// quietCap caps a lessee's read deadline at about quiet from now, keeping the last cap
// while half of it is left: a new deadline each read would reset a runtime timer each read.
func (rs *readState) quietCap(deadline time.Time, quiet time.Duration) time.Time {
	now := time.Now()
	left := rs.rdl.Sub(now)
	keep := left >= quiet/2 && left <= quiet
	if keep && (deadline.IsZero() || !rs.rdl.After(deadline)) {
		return rs.rdl
	}
	return earliest(deadline, now.Add(quiet))
}

// earliest is the earlier of two deadlines, where zero is none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// minOf is the builtin min for any ordered type, which upstream's min (of ints) shadows in
// this package.
func minOf[T cmp.Ordered](a, b T) T {
	if b < a {
		return b
	}
	return a
}

// maxOf is the builtin max for any ordered type, as minOf.
func maxOf[T cmp.Ordered](a, b T) T {
	if b > a {
		return b
	}
	return a
}

// setReadDeadline sets the socket's read deadline unless it is already set. A new deadline
// resets a runtime timer, so the drainer sets one only when it changes, or when one that
// passed left the socket's deadline unknown (rdlStale): without that, a past deadline
// would stay, and every read would end at once.
func (rs *readState) setReadDeadline(deadline time.Time) {
	if rs.nc == nil || !rs.rdlStale && deadline.Equal(rs.rdl) {
		return
	}
	_ = rs.nc.SetReadDeadline(deadline)
	rs.rdl = deadline
	rs.rdlStale = false
}

// heartbeatClock does heartbeat arithmetic on the send interval (half the negotiated
// heartbeat, as upstream's heartbeater sends; 0: no heartbeats).
//
// The duty: every window (1.5 intervals) at the most, the turn holder checks whether
// anything was written since the last duty, and writes a heartbeat if not. So the broker
// hears from us at least every 2 windows, 1.5 heartbeats, inside the 2 it allows; and
// while we write anyway, no heartbeat is written at all.
type heartbeatClock struct{ interval time.Duration }

// timeout returns the error to fail with if the broker is dead at now, else nil: silent
// for 1.5 heartbeats, as upstream's reader judges.
func (h heartbeatClock) timeout(lastRecv, now time.Time) *Error {
	silent := now.Sub(lastRecv)
	if h.interval <= 0 || silent < deadAfter*h.interval {
		return nil
	}
	return &Error{Code: FrameError, Reason: fmt.Sprintf(
		"heartbeat timeout: no frame from the broker for %s (heartbeat %s)",
		silent.Round(time.Millisecond), 2*h.interval)}
}

// window is the most between two duties (the broker's frames usually carry them).
func (h heartbeatClock) window() time.Duration { return h.interval + h.interval/2 }

// readDeadline is the broker's death or the next duty, whichever is first.
func (h heartbeatClock) readDeadline(lastRecv, dutyAt time.Time) time.Time {
	death := lastRecv.Add(deadAfter * h.interval)
	return earliest(death, dutyAt.Add(h.window()))
}

// dutyDue reports whether the duty last done at dutyAt is owed at now.
func (h heartbeatClock) dutyDue(dutyAt, now time.Time) bool {
	return now.Sub(dutyAt) >= h.window()
}

// piggyback reports whether a frame read at now carries the duty: while frames stream,
// half an interval apart, so that an idle connection wakes once an interval, not at
// every frame.
func (h heartbeatClock) piggyback(dutyAt, now time.Time) bool {
	return !dutyAt.IsZero() && now.Sub(dutyAt) >= h.interval/2
}

// heartbeatBytes is a heartbeat frame on the wire (spec 4.2.7).
var heartbeatBytes = []byte{frameHeartbeat, 0, 0, 0, 0, 0, 0, frameEnd}

// duty does the heartbeat duty at now: a heartbeat, unless something was written since
// the last duty. It never waits for c.sendM: its holder is writing, and that is traffic.
// The heartbeat goes through the generation's socket writer, so it is counted, and in
// legacy mode it takes the transport lock as every write does.
func (b *readBase) duty(g *readGen, interval time.Duration, now time.Time) *Error {
	rs := &g.read
	rs.dutyAt = now
	if sent := g.sent.Load(); sent != rs.lastBeat {
		rs.lastBeat = sent
		return nil
	}
	if rs.nc == nil || !b.c.sendM.TryLock() {
		return nil
	}
	defer b.c.sendM.Unlock()
	if bw, ok := b.c.writer.w.(*bufio.Writer); ok && bw.Buffered() > 0 {
		return nil // a publish is between frames: traffic is flowing
	}
	// A broker that stopped reading must not hold the turn: bound the write.
	_ = rs.nc.SetWriteDeadline(now.Add(interval))
	n, err := b.pub.out.Write(heartbeatBytes)
	_ = rs.nc.SetWriteDeadline(time.Time{})
	rs.lastBeat = g.sent.Load()
	if err == nil || n == 0 && errors.Is(err, errDeadline) {
		return nil // nothing written by the deadline: the broker is not reading; try later
	}
	return &Error{Code: FrameError, Reason: fmt.Sprintf("writing a heartbeat: %v", err)}
}

// routeFrames is the frame loop, upstream's demux: it routes each complete frame in g's
// splitter to the mode, channel 0 through route0 and the rest through the content
// reader, then handOn. It returns how many it routed, and stop once reading must end. In
// legacy a routed frame may run the teardown inline (connection.close), so it stops once
// g is dead.
func (b *readBase) routeFrames(g *readGen) (routed int, stop bool, err *Error) {
	rs := &g.read
	for {
		raw, rerr := rs.split.next()
		if rerr != nil {
			return routed, true, &Error{Code: FrameError, Reason: rerr.Error()}
		}
		if raw == nil {
			return routed, false, nil
		}
		routed++
		if stop, err := b.routeFrame(g, raw); stop {
			return routed, true, err
		}
		if b.inline && g.isDead() {
			return routed, true, nil
		}
	}
}

// routeFrame routes one complete frame; stop ends reading, with err. The frame is counted
// before the mode routes it: a DrainEvents caller it wakes must not take it for progress
// made after it began.
func (b *readBase) routeFrame(g *readGen, raw []byte) (stop bool, err *Error) {
	rs := &g.read
	id := binary.BigEndian.Uint16(raw[1:3])
	if id == 0 {
		f, perr := rs.split.parse(raw)
		if perr != nil {
			return true, &Error{Code: FrameError, Reason: fmt.Sprintf("malformed frame: %v", perr)}
		}
		g.activity.frames.Add(1)
		return b.mode.route0(g, f)
	}
	step, err := rs.cr.channelFrame(b.c, rs.split, id, raw)
	if err != nil {
		return true, err
	}
	if b.obs != nil {
		b.observeStep(step)
	}
	g.activity.frames.Add(1)
	b.mode.handOn(step)
	return false, nil
}

// observeStep tells the Observer (not nil) of a confirm or return.
func (b *readBase) observeStep(step chanStep) {
	switch {
	case step.method != nil:
		switch m := step.method.Method.(type) {
		case *basicAck:
			step.ch.observeConfirm(m.DeliveryTag, m.Multiple, true)
		case *basicNack:
			step.ch.observeConfirm(m.DeliveryTag, m.Multiple, false)
		}
	case step.msg != nil:
		if r, ok := step.msg.(*basicReturn); ok && b.obs.Returned != nil {
			b.obs.Returned(newReturn(*r))
		}
	}
}
