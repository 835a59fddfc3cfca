// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"fmt"
	"sync"
	"time"
)

// A blocked send holds the owner's notify lock (read side), so upstream cannot close the
// listener under it, for a slice at most: a Notify*, Close or shutdown waits at most
// outboxMaxSlice for it, a close at most closeWait plus a slice (upstream: 5 s a notification;
// TestUnitOutboxSliceSchedule). Slices start at outboxMinSlice and double, so a listener that
// is merely slow costs few wake-ups, and one that never reads costs one wake-up a 50 ms.
const (
	outboxMinSlice = time.Millisecond
	outboxMaxSlice = 50 * time.Millisecond
)

// outItem is an outbox's entry: one frame's notifications, confirmations to settle, or an action.
// The three differ in what a close may drop: notifications are the listeners' to lose, but a
// settlement or an action must still run, or a publisher waits for ever on its confirmation,
// or a cancelled consumer's chan or a channel is never closed.
type outItem interface {
	// handOver offers what is left and reports whether all is handed over,
	// waiting at most one slice for a listener, under the notify lock (read).
	handOver(o *outbox, slice time.Duration, timer **time.Timer) (done bool)
	// drop gives up what is left for listeners; settlements and actions still run, since
	// a DeferredConfirmation must settle and a close must happen.
	drop()
	cost() int64        // charged to the budget while the item waits
	kind() ListenerKind // the listeners it waits for; "" for actions
	count() int         // the notifications it holds
}

// queuedItem is an item, when it was queued (monoNow), its number (for a close's drop) and its
// charge. The charge is kept with it, so that doneItem releases exactly what putLocked charged
// without asking the item again.
type queuedItem struct {
	it   outItem
	at   int64
	seq  uint64
	cost int64
}

// monoBase is the origin of monoNow's readings.
var monoBase = time.Now()

// monoNow is a monotonic reading in ns, cheaper to keep than a time.Time (8 bytes, not 24, and
// atomic as an int64).
func monoNow() int64 { return int64(time.Since(monoBase)) }

// outbox hands one channel's notifications (or the connection's blocked and unblocked) to their
// listeners in frame order across listeners, as upstream (a basic.return before the ack that
// settles its DeferredConfirmation; apps rely on it), on a workQueue goroutine that exists only
// while items wait: an unread listener holds back only its own channel.
//
// One goroutine at a time produces into it (the channel's dispatcher, or for the connection's,
// the read turn's holder), so an idle outbox stays idle until the producer queues, which may
// then hand a notification over inline (notifyAllInOrder), with no goroutine and no queueing.
//
// Locks: mu (workQueue's) guards the queue and the counts below it; lock, the owner's notifyM,
// is held (read side) across a hand-over, as upstream holds it across notifyAll, and (write
// side) to drop a listener. A dispatcher's outbox has drainConn.mu as its outer lock.
type outbox struct {
	workQueue[queuedItem] // the front is being handed over

	// lock and closed point into the owner (a Channel, or the Connection) rather than copy: the
	// hand-over must see the very flag that upstream's code sets under that very lock.
	lock       *sync.RWMutex // the owner's notifyM, held by upstream while it closes listeners
	closed     *bool         // the owner's noNotify, guarded by lock
	closeWait  time.Duration // how long a close waits for the notifications before it
	retired    func()        // runs under outer when the outbox empties, if set
	sliceTimer *time.Timer   // a blocked hand-over's slice (the goroutine's only)

	// Under mu: queued numbers the items; those up to dropThrough drop once dropAt passed
	// (a close's deadline, dropBefore).
	queued      uint64
	dropThrough uint64
	dropAt      time.Time

	// For Stats, the warnings and the stall policy (watch.go).
	channel uint16       // the owner's channel id, 0 for the connection
	bytes   int64        // what the waiting items are charged, under mu
	notes   int          // notifications in the waiting items, under mu
	watch   *watcher     // nil when nobody watches
	dropped map[any]bool // listeners given up on, under lock
	// forget closes and unregisters a dropped listener, under lock (write side); false if it
	// was not registered. Set for a channel's outbox only: blocked listeners are never dropped.
	forget func(any) bool
}

// queue appends an item, charged, starting the goroutine if none runs, and returns its seq. The
// watcher looks at the depth after mu is let go: it may log through the user's Logger.
func (o *outbox) queue(it outItem) uint64 {
	cost := it.cost()
	at := monoNow()
	o.mu.Lock()
	o.queued++
	seq := o.queued
	start := o.putLocked(queuedItem{it, at, seq, cost}, cost)
	o.bytes += cost
	o.notes += it.count()
	h := o.headLocked(at) // for the depth warning
	o.mu.Unlock()
	// start is true for the first item of a burst only (runQueue's running flag, under mu), so
	// one goroutine at most hands this outbox's items over, and they stay in order.
	if start {
		go o.loop(o)
	}
	if o.watch != nil {
		o.watch.queued(o, h)
	}
	return seq
}

// dropBefore makes the items queued before seq, a close (0: all so far), droppable after wait:
// a close waits for the notifications before it, but not for ever. Of two closes, the earlier
// deadline and the later seq win.
func (o *outbox) dropBefore(seq uint64, wait time.Duration) {
	at := time.Now().Add(wait)
	o.mu.Lock()
	defer o.mu.Unlock()
	if seq == 0 {
		seq = o.queued + 1
	}
	if q := o.items.queued(); len(q) == 0 || q[0].seq >= seq {
		return // done already
	}
	if seq-1 > o.dropThrough {
		o.dropThrough = seq - 1
	}
	o.dropAt = earliest(o.dropAt, at)
}

// dropQueued makes everything queued so far droppable now.
func (o *outbox) dropQueued() { o.dropBefore(0, 0) }

// runItem hands an item over in slices doubling up to outboxMaxSlice, or drops it after a
// close's wait. Between slices the notify lock is let go (handOver), so that upstream may close
// the listeners, and the watcher may warn or drop the stalled listener.
//
// An item is only dropped after a slice it waited in vain, never before its first try: a close
// bounds how long a listener may hold it, it does not throw away what a listener can take.
func (o *outbox) runItem(q queuedItem) {
	for slice := outboxMinSlice; !q.it.handOver(o, slice, &o.sliceTimer); {
		o.mu.Lock()
		drop := q.seq <= o.dropThrough && !time.Now().Before(o.dropAt)
		o.mu.Unlock()
		if drop {
			q.it.drop()
			return
		}
		if o.watch != nil {
			o.watch.waiting(o, q.it, q.at)
		}
		slice = minOf(2*slice, outboxMaxSlice)
	}
}

// doneItem uncounts a finished item (under mu), and forgets a close's deadline once no item it
// covers is left, so that items queued after the close are not dropped by it.
func (o *outbox) doneItem(q queuedItem) int64 {
	o.bytes -= q.cost
	o.notes -= q.it.count()
	if q.seq >= o.dropThrough {
		o.dropThrough = 0
		o.dropAt = time.Time{}
	}
	return q.cost
}

// retire runs the owner's retired (under outer and mu); an outbox's goroutine never parks: it
// exists only while items wait.
func (o *outbox) retire() bool {
	if o.retired != nil {
		o.retired()
	}
	return false
}

// notifyAllInOrder is upstream's notifyAll in frame order: it hands vs to ls after what was
// queued. When the outbox is idle and every listener has room, it does so inline, allocating
// nothing; else what is left is queued for the outbox's goroutine.
func notifyAllInOrder[T any](o *outbox, ls []chan T, cost func(T) int64, vs ...T) {
	if len(ls) == 0 || len(vs) == 0 {
		return
	}
	// idle is only a true answer to act on for the producer (workQueue.idle): nothing else
	// queues here, so the outbox cannot turn busy between this look and the hand-over.
	n := notes[T]{ls: ls, vs: vs}
	if o.idle() && n.handOver(o, 0, nil) {
		return
	}
	// What the inline attempt handed over is not sent again: n's li and vi say where it stopped,
	// and the copy resumes there.
	left := n // copied, so that the inline attempt allocates nothing
	for _, v := range vs {
		left.total += cost(v) * int64(len(ls)) // each listener holds its own copy
	}
	o.queue(&left)
}

// inOrder runs f after what was queued, and returns its seq (0: ran at once, as the outbox was
// idle and only its producer calls this).
func (o *outbox) inOrder(f func()) uint64 {
	if o.idle() {
		f()
		return 0
	}
	return o.queue(action(f))
}

// closeInOrder runs a close in order; what was queued before it is dropped after closeWait, so
// that an unread listener cannot hold a channel's close for ever.
//
// The close must come after them: it may close the listeners and set noNotify (upstream's
// closeResources), after which handOver sends nothing, so a notification the broker sent before
// the close would be lost.
func (o *outbox) closeInOrder(f func()) {
	if seq := o.inOrder(f); seq > 0 {
		o.dropBefore(seq, o.closeWait)
	}
}

// notes are one frame's values for every listener of one kind: every value goes to every
// listener, value by value; li and vi resume a blocked hand-over where it stopped.
type notes[T any] struct {
	ls     []chan T
	vs     []T
	li, vi int   // next: vs[vi] to ls[li]
	total  int64 // what the values cost for every listener (cost), set as they are queued
}

// count is the values held; drop has nothing to run: dropped notifications are just lost.
func (n *notes[T]) count() int { return len(n.vs) }
func (n *notes[T]) drop()      {}

// kind names the listeners of values of type T, for Stats and the warnings.
func (n *notes[T]) kind() ListenerKind {
	switch any((*T)(nil)).(type) {
	case *Confirmation:
		return KindNotifyPublish
	case *Return:
		return KindNotifyReturn
	case *bool:
		return KindNotifyFlow
	case *string:
		return KindNotifyCancel
	case *Blocking:
		return KindNotifyBlocked
	}
	return ListenerKind(fmt.Sprintf("%T", *new(T)))
}

// blocked is the listener the hand-over waits for, or nil: the one the stall policy drops.
func (n *notes[T]) blocked() any {
	if n.vi < len(n.vs) && n.li < len(n.ls) {
		return n.ls[n.li]
	}
	return nil
}

// cost is what the values cost for every listener: each listener holds its own copy.
func (n *notes[T]) cost() int64 { return n.total }

// handOver sends what is left, each value to each listener. With slice 0 (the inline attempt)
// it waits for nothing, not even the lock: the producer must not wait for a listener. Else a
// full listener is waited for one slice, then handOver returns false for runItem to decide.
//
// The read side of the notify lock is what makes the sends safe: upstream closes the listeners
// under its write side and then sets *closed, and the stall policy closes one under it too and
// marks it dropped. Checked under the read lock, neither can close a chan in the middle of a
// send here, which would panic.
func (n *notes[T]) handOver(o *outbox, slice time.Duration, timer **time.Timer) bool {
	if slice > 0 {
		o.lock.RLock()
	} else if !o.lock.TryRLock() {
		return false
	}
	defer o.lock.RUnlock()
	if *o.closed {
		return true // upstream closed the listeners: nothing to hand over
	}
	for ; n.vi < len(n.vs); n.vi, n.li = n.vi+1, 0 {
		for ; n.li < len(n.ls); n.li++ {
			if o.dropped != nil && o.dropped[n.ls[n.li]] {
				continue // closed by the stall policy
			}
			// Without waiting first: most listeners have room, and then no timer is armed.
			select {
			case n.ls[n.li] <- n.vs[n.vi]:
				continue
			default:
			}
			if slice == 0 {
				return false
			}
			// The timer is the outbox goroutine's own, reused across slices and items; stopTimer
			// leaves it with no stale tick for the next slice's start.
			select {
			case n.ls[n.li] <- n.vs[n.vi]:
				stopTimer(*timer)
			case <-startTimer(timer, slice):
				return false
			}
		}
	}
	return true
}

// action runs in order with the notifications: a cancelled consumer's end, a channel's close.
// It runs even when dropped, as what it does is not a listener's to lose.
type action func()

// An action costs a frame, counts as one item, and is of no listener's kind.
func (a action) handOver(*outbox, time.Duration, **time.Timer) bool { a(); return true }
func (a action) drop()                                              { a() }
func (a action) cost() int64                                        { return frameCost }
func (a action) kind() ListenerKind                                 { return "" }
func (a action) count() int                                         { return 1 }

// settlement resolves DeferredConfirmations taken out of their set (take), in order after the
// notifications before them. Dropped, it still settles: a publisher waits on each.
type settlement struct {
	dcs []*DeferredConfirmation
	ack bool
}

func (s *settlement) handOver(*outbox, time.Duration, **time.Timer) bool {
	for _, dc := range s.dcs {
		dc.setAck(s.ack)
	}
	return true
}

func (s *settlement) drop()              { _ = s.handOver(nil, 0, nil) }
func (s *settlement) cost() int64        { return frameCost * int64(len(s.dcs)) }
func (s *settlement) kind() ListenerKind { return KindDeferredConfirmation }
func (s *settlement) count() int         { return len(s.dcs) }

// take removes and returns what a confirm of tag (and every tag before it, if multiple)
// settles, so that they settle later, in order, and nothing else does (upstream's reset and
// Close nack only what is in the set). None is outside [from, last]: looking only there avoids
// walking a large set behind an unread listener, as upstream's ConfirmMultiple does; a range
// larger than the set is walked as the set instead.
func (d *deferredConfirmations) take(
	from, last, tag uint64, multiple bool,
) []*DeferredConfirmation {
	d.m.Lock()
	defer d.m.Unlock()
	if !multiple {
		from = tag
		last = tag
	}
	var dcs []*DeferredConfirmation
	if last >= from && last-from < uint64(len(d.confirmations)) {
		for k := from; k <= last; k++ {
			if dc, found := d.confirmations[k]; found {
				dcs = append(dcs, dc)
				delete(d.confirmations, k)
			}
		}
		return dcs
	}
	for k, dc := range d.confirmations {
		if k <= tag {
			dcs = append(dcs, dc)
			delete(d.confirmations, k)
		}
	}
	return dcs
}
