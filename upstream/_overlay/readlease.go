// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"sync/atomic"
	"time"
)

// Leader/follower reading (#29). A ConsumeFunc with nothing queued may read the socket itself as
// the drainer would (readStep), running its own deliveries with no goroutine hop, while the drainer
// parks. The drainer lends its turn after reads that brought bytes; it takes it back when a
// lessee's read found the socket quiet for leaseQuiet, the budget is over or the generation ends;
// when no lessee read ended for leaseCheck and none is under way (a handler runs long); and at
// once for a caller waiting for a reply or a confirm (reclaim), since no lessee may be reading.
// Both are 10 ms, not 1: the runtime wakes every T for a timer due within T, even one pushed
// back; drain CPU was 1.48× go-floor's at 2 ms, 1.25× at 10 (docs/receiving.md).
const (
	leaseCheck = 10 * time.Millisecond
	leaseQuiet = 10 * time.Millisecond
)

// lease is a generation's read turn and its lending.
type lease struct {
	turn    chan struct{} // cap 1, a token while someone reads: the drainer, else a lessee
	back    chan struct{} // cap 1: a lessee gives the turn back to the drainer
	wanted  atomic.Bool   // a ConsumeFunc waits with the turn as one of its cases
	lent    atomic.Bool   // the drainer is parked in lend
	readEnd atomic.Int64  // monoNow at a lessee's last read's end, for the watch
	watch   *time.Timer   // the drainer's, running in lend: fires leaseCheck after readEnd
	watchAt atomic.Int64  // monoNow when the watch is due (arm)
	stopped bool          // a lessee's read ended the generation, with stopErr (turn held)
	stopErr *Error
}

// consumerReader lends the current generation's turn to a ConsumeFunc.
func (d *drainConn) consumerReader() consumerReader {
	if g := d.current(); g != nil {
		return g
	}
	return nil
}

// readTurn is the turn for a ConsumeFunc to take, which asks for it.
func (g *drainGen) readTurn() chan struct{} {
	if !g.wanted.Load() {
		g.wanted.Store(true)
	}
	return g.turn
}

// lend parks the drainer with its turn lent out until it is given back,
// or the watch fires with no lessee read for leaseCheck; stop once g ended
// (turn not held). Lessees push the watch back: streaming wakes nobody.
func (g *drainGen) lend() (stop bool, err *Error) {
	g.lent.Store(true)
	defer g.lent.Store(false)
	now := monoNow()
	g.readEnd.Store(now)
	g.arm(now, leaseCheck)
	defer g.watch.Stop()
	<-g.turn
	for {
		select {
		case <-g.dead:
			return true, nil
		case <-g.back:
		case <-g.watch.C: // maybe stale (asynctimerchan): readEnd decides
			now := monoNow()
			if quiet := time.Duration(now - g.readEnd.Load()); len(g.turn) > 0 {
				g.arm(now, leaseCheck) // a read is under way
				continue
			} else if quiet < leaseCheck {
				g.arm(now, leaseCheck-quiet)
				continue
			}
		}
		select {
		case <-g.dead:
			return true, nil
		case g.turn <- struct{}{}:
		}
		select {
		case <-g.back: // a lessee's since taking the turn: it is back already
		default:
		}
		return g.stopped, g.stopErr
	}
}

// pumpFor is a lessee's read, with g's turn taken; nil: look at box again.
func (g *drainGen) pumpFor(_ context.Context, box *inbox) error {
	defer func() { <-g.turn }()
	switch {
	case g.stopped || g.isDead():
		return ErrClosed // this ConsumeFunc reads no more: others bring the rest
	case len(box.wake) > 0:
		return nil
	}
	if over, _ := g.d.budget.over(); over {
		g.giveBack() // the drainer pauses
		return nil
	}
	idle, stop, err := g.readStep(g.d, leaseQuiet)
	now := monoNow()
	g.readEnd.Store(now)
	if g.watchAt.Load()-now < int64(leaseCheck/2) { // a Reset wakes the runtime's poller: not every read
		g.arm(now, leaseCheck)
	}
	if stop {
		g.stopped, g.stopErr = true, err
		g.giveBack()
		return ErrClosed
	} else if idle {
		g.giveBack()
	}
	return nil
}

// arm sets the watch to fire d after now (monoNow).
func (g *drainGen) arm(now int64, d time.Duration) {
	g.watchAt.Store(now + int64(d))
	g.watch.Reset(d)
}

// quietCap caps a lessee's read deadline at about quiet from now, keeping the last cap while
// half of it is left: a new one each read would reset a runtime timer each read.
func (g *drainGen) quietCap(deadline time.Time, quiet time.Duration) time.Time {
	now := time.Now()
	if left := g.rdl.Sub(now); left >= quiet/2 && left <= quiet && (deadline.IsZero() || !g.rdl.After(deadline)) {
		return g.rdl
	}
	if cap := now.Add(quiet); deadline.IsZero() || cap.Before(deadline) {
		return cap
	}
	return deadline
}

// reclaim takes the turn back for a caller about to wait for a frame (nil g: none).
func (g *drainGen) reclaim() {
	if g != nil && g.lent.Load() {
		g.giveBack()
	}
}

// giveBack wakes the parked drainer to take its turn back.
func (g *drainGen) giveBack() {
	select {
	case g.back <- struct{}{}:
	default:
	}
}
