// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"fmt"
	"sync"
	"time"
)

// A blocked send holds the owner's notify lock (read side), so upstream cannot close the listener
// under it, for a slice at most: a Notify*, Close or shutdown waits at most outboxMaxSlice for it, a
// close at most closeWait plus a slice (upstream: 5 s a notification; TestUnitOutboxSliceSchedule).
const (
	outboxMinSlice = time.Millisecond
	outboxMaxSlice = 50 * time.Millisecond
)

// outItem is an outbox's entry: one frame's notifications, confirmations to settle, or an action.
type outItem interface {
	// handOver offers what is left and reports whether all is handed over,
	// waiting at most one slice for a listener, under the notify lock (read).
	handOver(o *outbox, slice time.Duration, timer **time.Timer) (done bool)
	// drop gives up what is left for listeners; settlements and actions still run: a DeferredConfirmation must settle.
	drop()
	cost() int64        // charged to the budget while the item waits
	kind() ListenerKind // the listeners it waits for; "" for actions
	count() int         // the notifications it holds
}

// queuedItem is an item, when it was queued (monoNow), its number and charge.
type queuedItem struct {
	it   outItem
	at   int64
	seq  uint64
	cost int64
}

var monoBase = time.Now()

// monoNow is a monotonic reading in ns, cheaper to keep than a time.Time.
func monoNow() int64 { return int64(time.Since(monoBase)) }

// outbox hands one channel's notifications (or the connection's blocked and unblocked) to their
// listeners in frame order across listeners, as upstream (a basic.return before the ack that
// settles its DeferredConfirmation; apps rely on it), on a workQueue goroutine that exists only
// while items wait: an unread listener holds back only its own channel. One goroutine at a time
// produces into it (the channel's dispatcher, or the drainer), so an idle outbox stays idle until
// the producer queues, which may then hand a notification over inline.
type outbox struct {
	workQueue[queuedItem] // the front is being handed over

	lock       *sync.RWMutex // the owner's notifyM, held by upstream while it closes listeners
	closed     *bool         // the owner's noNotify, guarded by lock
	closeWait  time.Duration // how long a close waits for the notifications before it
	retired    func()        // runs under outer when the outbox empties, if set
	sliceTimer *time.Timer   // a blocked hand-over's slice (the goroutine's only)

	// Under mu: queued numbers the items; up to dropThrough, they drop once dropAt passed (a close's).
	queued      uint64
	dropThrough uint64
	dropAt      time.Time

	// For Stats, the warnings and the stall policy (watch.go).
	channel uint16         // the owner's channel id, 0 for the connection
	bytes   int64          // what the waiting items are charged, under mu
	notes   int            // notifications in the waiting items, under mu
	watch   *watcher       // nil when nobody watches
	forget  func(any) bool // closes and unregisters a dropped listener, under lock (write); false if not registered
	dropped map[any]bool   // listeners given up on, under lock
}

// queue appends an item, charged, starting the goroutine, and returns its seq.
func (o *outbox) queue(it outItem) uint64 {
	cost, at := it.cost(), monoNow()
	o.mu.Lock()
	o.queued++
	seq := o.queued
	start := o.putLocked(queuedItem{it, at, seq, cost}, cost)
	o.bytes += cost
	o.notes += it.count()
	h := o.headLocked(at) // for the depth warning
	o.mu.Unlock()
	if start {
		go o.loop(o)
	}
	if o.watch != nil {
		o.watch.queued(o, h)
	}
	return seq
}

// dropBefore makes the items queued before seq, a close (0: all so far), droppable after wait.
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
	if o.dropAt.IsZero() || at.Before(o.dropAt) {
		o.dropAt = at
	}
}

// dropQueued makes everything queued so far droppable now.
func (o *outbox) dropQueued() { o.dropBefore(0, 0) }

// runItem hands an item over in slices doubling up to outboxMaxSlice, or drops it after a close's wait.
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
		if slice *= 2; slice > outboxMaxSlice {
			slice = outboxMaxSlice
		}
	}
}

// doneItem uncounts a finished item, and forgets a close's deadline once no item it covers is left.
func (o *outbox) doneItem(q queuedItem) int64 {
	o.bytes -= q.cost
	o.notes -= q.it.count()
	if q.seq >= o.dropThrough {
		o.dropThrough, o.dropAt = 0, time.Time{}
	}
	return q.cost
}

// retire runs the owner's retired; the goroutine never parks.
func (o *outbox) retire() bool {
	if o.retired != nil {
		o.retired()
	}
	return false
}

// notifyAllInOrder hands vs to ls after what was queued: inline if idle and all have room.
func notifyAllInOrder[T any](o *outbox, ls []chan T, cost func(T) int64, vs ...T) {
	if len(ls) == 0 || len(vs) == 0 {
		return
	}
	n := notes[T]{ls: ls, vs: vs, costOf: cost}
	if o.idle() && n.handOver(o, 0, nil) {
		return
	}
	left := new(notes[T]) // copied, so that the inline attempt allocates nothing
	*left = n
	o.queue(left)
}

// inOrder runs f after what was queued, and returns its seq (0: ran at once).
func (o *outbox) inOrder(f func()) uint64 {
	if o.idle() {
		f()
		return 0
	}
	return o.queue(action(f))
}

// closeInOrder runs a close in order; what was queued before it is dropped after closeWait.
func (o *outbox) closeInOrder(f func()) {
	if seq := o.inOrder(f); seq > 0 {
		o.dropBefore(seq, o.closeWait)
	}
}

// notes are one frame's values for every listener of one kind.
type notes[T any] struct {
	ls     []chan T
	vs     []T
	li, vi int // next: vs[vi] to ls[li]
	costOf func(T) int64
}

func (n *notes[T]) count() int { return len(n.vs) }
func (n *notes[T]) drop()      {}

// kind names the listeners of values of type T.
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

// blocked is the listener the hand-over waits for, or nil.
func (n *notes[T]) blocked() any {
	if n.vi < len(n.vs) && n.li < len(n.ls) {
		return n.ls[n.li]
	}
	return nil
}

func (n *notes[T]) cost() int64 {
	var c int64
	for _, v := range n.vs {
		c += n.costOf(v) * int64(len(n.ls))
	}
	return c
}

// handOver with slice 0 (the inline attempt) waits for nothing, not even the lock.
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
			select {
			case n.ls[n.li] <- n.vs[n.vi]:
				continue
			default:
			}
			if slice == 0 {
				return false
			}
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
type action func()

func (a action) handOver(*outbox, time.Duration, **time.Timer) bool { a(); return true }
func (a action) drop()                                              { a() }
func (a action) cost() int64                                        { return frameCost }
func (a action) kind() ListenerKind                                 { return "" }
func (a action) count() int                                         { return 1 }

// settlement resolves DeferredConfirmations taken out of their set (take).
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

// take removes and returns what a confirm of tag (and every tag before it, if multiple) settles,
// so that they settle later, in order, and nothing else does (upstream's reset and Close nack only
// what is in the set). None is outside [from, last]: looking only there avoids walking a large set
// behind an unread listener, as upstream's ConfirmMultiple does.
func (d *deferredConfirmations) take(from, last, tag uint64, multiple bool) []*DeferredConfirmation {
	d.m.Lock()
	defer d.m.Unlock()
	if !multiple {
		from, last = tag, tag
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
