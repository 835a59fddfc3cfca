// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"sync/atomic"
	"time"
)

// Leader/follower reading (#29). A ConsumeFunc with nothing queued may
// read the socket itself, decode inline and run its deliveries with no
// goroutine hop, while the drainer parks. The drainer lends its turn only
// between reads that brought bytes, and takes it back when a lessee's
// read found the socket quiet for leaseQuiet, when the budget is over,
// when the generation ends, or when no lessee read began or ended for a
// leaseCheck tick, as when a handler runs long: then the socket waits at
// most two ticks for a reader. A caller that waits for a reply or a
// confirm has it taken back at once (reclaim), since no lessee may read. A lessee reads exactly as the drainer does
// (readStep): routing, heartbeats and the order of every listener hold.
const (
	leaseCheck = time.Millisecond
	leaseQuiet = time.Millisecond
)

// lease is a generation's read turn and its lending.
type lease struct {
	turn    chan struct{} // cap 1, a token while someone reads: the drainer, else a lessee
	back    chan struct{} // cap 1: a lessee gives the turn back to the drainer
	wanted  atomic.Bool   // a ConsumeFunc waits with the turn as one of its cases
	lent    atomic.Bool   // the drainer is parked in lend
	moves   atomic.Uint64 // lessee reads begun and ended: what the drainer's tick looks for
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
// or no lessee moved for a tick; stop once g ended (turn not held).
func (g *drainGen) lend() (stop bool, err *Error) {
	g.lent.Store(true)
	defer g.lent.Store(false)
	<-g.turn
	tick := time.NewTicker(leaseCheck)
	defer tick.Stop()
	for seen := g.moves.Load(); ; {
		select {
		case <-g.dead:
			return true, nil
		case <-g.back:
		case <-tick.C:
			if moved := g.moves.Load(); moved != seen || len(g.turn) > 0 {
				seen = moved
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
	g.moves.Add(1)
	idle, stop, err := g.readStep(g.d, leaseQuiet)
	g.moves.Add(1)
	if stop {
		g.stopped, g.stopErr = true, err
		g.giveBack()
		return ErrClosed
	} else if idle {
		g.giveBack()
	}
	return nil
}

// reclaim takes the turn back for a caller about to wait for a frame.
func (d *drainConn) reclaim(context.Context, <-chan struct{}) error {
	if g := d.current(); g != nil && g.lent.Load() {
		g.giveBack()
	}
	return nil
}

// giveBack wakes the parked drainer to take its turn back.
func (g *drainGen) giveBack() {
	select {
	case g.back <- struct{}{}:
	default:
	}
}
