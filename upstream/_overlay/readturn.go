// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// readTurn is the right to read a generation's socket and route what the read brings. Both
// modes read the same way, through readStep (readstep.go), and differ only in who takes
// the turn:
//
//   - A holder goroutine keeps the turn by default: the drainer's, or in legacy mode
//     AutoDrain's (holdTurn). It lends the turn to a ConsumeFunc that waits for it, so that
//     the ConsumeFunc runs its deliveries on its own goroutine with no hop (the lease, below).
//   - With no holder (plain legacy), callers take it: DrainEvents, an RPC or confirmation
//     waiter, a ConsumeFunc. Nothing reads unless one of them does.
//
// What the turn guarantees: one reader at a time. The frame splitter, the content being
// assembled and the heartbeat clock (readState) have no lock of their own: the turn is
// their lock. Without it two readers would split one byte stream between them, and a
// frame's bytes would land in two buffers.
//
// What carries it: slot, a chan of capacity 1. Taking the turn is a send into it and
// giving it back a receive, so each hand-over is a happens-before edge between the last
// holder's writes to readState and the next holder's reads (the Go memory model's rule for
// buffered chans). A send can also sit in a select beside a ConsumeFunc's other events,
// which a mutex cannot.
type readTurn struct {
	slot chan struct{} // cap 1: full while someone holds the turn
	lease
}

func newReadTurn() readTurn {
	return readTurn{slot: make(chan struct{}, 1), lease: lease{back: make(chan struct{}, 1)}}
}

// take waits for the turn.
func (t *readTurn) take() { t.slot <- struct{}{} }

// release gives the turn back; only its holder may call it.
func (t *readTurn) release() { <-t.slot }

// busy reports whether someone holds the turn now.
func (t *readTurn) busy() bool { return len(t.slot) > 0 }

// Leader/follower reading (#29). A ConsumeFunc with nothing queued may read the socket
// itself as the holder would (readStep), running its own deliveries with no goroutine hop,
// while the holder parks. The holder lends its turn between two steps. It takes it back
// when a lessee's read found the socket quiet for leaseQuiet, the budget is over or the
// generation ends; when no lessee read ended for leaseCheck and none is under way (a
// handler runs long); and at once for a caller waiting for a reply or a confirm
// (reclaim), since no lessee may be reading.
//
// Both are 10 ms, not 1: the runtime wakes every T for a timer due within T, even one
// pushed back; drain CPU was 1.48× go-floor's at 2 ms, 1.25× at 10 (docs/receiving.md).
const (
	leaseCheck = 10 * time.Millisecond
	leaseQuiet = 10 * time.Millisecond
)

// lease is the lending half of a readTurn.
//
// The protocol, in the order it runs:
//  1. A waiting ConsumeFunc calls offer: wanted is set, and the ConsumeFunc's select
//     waits to send into slot.
//  2. After a step, the holder sees wanted, clears it, and calls lend: it sets lent, arms
//     the timer, and receives from slot. That empties the slot, and the waiting send
//     succeeds: the lessee holds the turn.
//  3. The lessee reads one step (lesseeRead), gives the turn back to slot, and, when it
//     found the socket quiet or must stop, wakes the holder through back.
//  4. The holder, woken by back or by the timer with no lessee read for leaseCheck, sends
//     into slot again: it holds the turn. A lessee may win that send first; the holder
//     then waits for the slot, which the lessee empties at the end of its step.
//
// What each part is for: back lets the holder read again as soon as the socket goes
// quiet, not one timer later; the timer takes the turn back when the lessee stops reading
// without a word (its handler runs for minutes), or the socket would go unread, with no
// heartbeats and no replies; reclaim does the same at once for a caller about to wait for
// a reply or a confirm (often the lessee itself, calling Cancel from its handler), which
// would otherwise wait for the timer.
type lease struct {
	back    chan struct{} // cap 1: a lessee (or reclaim) wakes the parked holder
	wanted  atomic.Bool   // a ConsumeFunc waits with the turn as one of its select's cases
	lent    atomic.Bool   // the holder is parked in lend
	readEnd atomic.Int64  // monoNow at a lessee's last read's end, for the timer
	timer   *time.Timer   // the holder's, running in lend: fires leaseCheck after readEnd
	timerAt atomic.Int64  // monoNow when the timer is due (arm)
	// A lessee's read that ended the generation leaves why here, for the holder to fail
	// with once it takes the turn back, so that the holder's loop stays the one exit into
	// fail, as upstream's reader is. Written and read only by whoever holds the turn.
	stopped bool
	stopErr *Error
}

// offer is the turn for a waiting ConsumeFunc to take: it asks the holder to lend it.
func (t *readTurn) offer() chan struct{} {
	if !t.wanted.Load() { // a load is cheaper than a store on a shared cache line
		t.wanted.Store(true)
	}
	return t.slot
}

// lend parks the holder with its turn lent out until it is given back, or the timer fires
// with no lessee read for leaseCheck. held: the holder has the turn again, false once
// dead closed; stop: a lessee's read ended the generation, with err. Lessees push the
// timer back, so while deliveries stream nobody wakes the holder.
func (t *readTurn) lend(dead <-chan struct{}) (held, stop bool, err *Error) {
	t.lent.Store(true)
	defer t.lent.Store(false)
	if t.timer == nil {
		t.timer = time.NewTimer(leaseCheck)
	}
	now := monoNow()
	t.readEnd.Store(now)
	t.arm(now, leaseCheck)
	defer t.timer.Stop()
	t.release()
	for t.lentOut(dead) {
	}
	select {
	case <-dead:
		return false, true, nil
	case t.slot <- struct{}{}:
	}
	select {
	case <-t.back: // a lessee's since taking the turn: it is back already
	default:
	}
	return true, t.stopped, t.stopErr
}

// lentOut waits for one event while the turn is lent; false: take it back now.
func (t *readTurn) lentOut(dead <-chan struct{}) bool {
	select {
	case <-dead:
		return false
	case <-t.back:
		return false
	case <-t.timer.C: // maybe stale (asynctimerchan): readEnd decides
	}
	now := monoNow()
	if t.busy() { // a read is under way: look again later
		t.arm(now, leaseCheck)
		return true
	}
	quiet := time.Duration(now - t.readEnd.Load())
	if quiet < leaseCheck {
		t.arm(now, leaseCheck-quiet)
		return true
	}
	return false
}

// arm sets the timer to fire d after now (monoNow).
func (t *readTurn) arm(now int64, d time.Duration) {
	t.timerAt.Store(now + int64(d))
	t.timer.Reset(d)
}

// readEnded records a lessee's read's end, pushing the timer back. Not at every read:
// a Reset wakes the runtime's timer poller, so only when half the check is gone.
func (t *readTurn) readEnded() {
	now := monoNow()
	t.readEnd.Store(now)
	if t.timerAt.Load()-now < int64(leaseCheck/2) {
		t.arm(now, leaseCheck)
	}
}

// reclaim takes the turn back for a caller about to wait for a frame.
func (t *readTurn) reclaim() {
	if t.lent.Load() {
		t.giveBack()
	}
}

// giveBack wakes the parked holder to take its turn back.
func (t *readTurn) giveBack() {
	select {
	case t.back <- struct{}{}:
	default:
	}
}

// lesseeRead is a ConsumeFunc's step with a holder's turn lent to it, the turn held; nil:
// look at box again. The step's read is capped at leaseQuiet, so that a quiet socket
// sends the turn back to the holder, which owes the heartbeats.
func (b *readBase) lesseeRead(g *readGen, box *inbox) error {
	t := &g.turn
	defer t.release()
	switch {
	case t.stopped || g.isDead():
		return ErrClosed // this ConsumeFunc reads no more: the holder brings the rest
	case len(box.wake) > 0:
		return nil
	}
	if over, _ := b.deliveries.over(); over {
		t.giveBack() // the holder pauses
		return nil
	}
	res := b.readStep(g, stepLimits{quiet: leaseQuiet})
	g.activity.wake()
	t.readEnded()
	switch {
	case res.stop:
		t.stopped = true
		t.stopErr = res.err
		t.giveBack()
		return ErrClosed
	case res.idle:
		t.giveBack()
	}
	return nil
}

// holdTurn is the holder's loop, for the drainer and AutoDrain alike: read a step, and
// between steps lend the turn to a ConsumeFunc that wants it. before runs ahead of each
// step (the drainer's budget pause, AutoDrain's end at Close); its stop ends the loop and
// gives the turn back, so that a caller can read on. It returns the error to fail the
// generation with, nil for an end on purpose. After a read that ended the generation it
// keeps the turn: no lessee may read a socket whose generation is failing.
func (b *readBase) holdTurn(g *readGen, before func() (stop bool, err *Error)) *Error {
	t := &g.turn
	t.take()
	for {
		if stop, err := before(); stop {
			t.release()
			return err
		}
		res := b.readStep(g, stepLimits{})
		g.activity.wake()
		if res.stop {
			return res.err
		}
		if !t.wanted.Load() || g.read.nc == nil || !t.wanted.Swap(false) {
			continue // lending needs read deadlines: a lessee's quiet cap is one
		}
		// stop: a lessee's read ended the generation, with err, or it ended while the turn
		// was lent (not held again, err nil).
		if _, stop, err := t.lend(g.dead); stop {
			return err
		}
	}
}

// consumerRead is a ConsumeFunc's read with the turn held (it sent into offer's slot);
// nil: look at the inbox again. With a holder the turn was lent (lesseeRead); without,
// the ConsumeFunc reads as any legacy caller does, until a frame is routed.
func (b *readBase) consumerRead(ctx context.Context, g *readGen, box *inbox) error {
	if b.inline && b.isCalled() {
		g.turn.release()
		return ErrClosedIntentionally // legacy: Close reads its close-ok itself
	}
	if b.holder {
		return b.lesseeRead(g, box)
	}
	defer g.turn.release()
	switch {
	case len(box.wake) > 0: // a delivery came meanwhile
		return nil
	case g.isDead():
		return b.waitErr(&g.genEnd)
	}
	err := b.callerRead(ctx, g, true)
	if err != nil && !errors.Is(err, errInterrupted) && ctx.Err() == nil {
		return err
	}
	return nil
}
