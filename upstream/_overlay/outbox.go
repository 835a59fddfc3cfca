// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"fmt"
	"sync"
	"time"
)

// Notification order.
//
// Upstream's reader hands each notification to its listener before it
// reads the next frame, so the notifications of one channel reach their
// listeners in the order their frames arrived, across listeners: a
// basic.return is in the NotifyReturn chan before the basic.ack of the same
// message settles its DeferredConfirmation or reaches NotifyPublish, and a
// NotifyCancel listener holds the consumer tag before the deliveries chan
// closes. Applications rely on it (gocloud's rabbitpubsub reads returns and
// confirms in one select loop and stops at the last confirm).
//
// The drainer keeps that order with one outbox per channel (and one for the
// connection's blocked/unblocked): a queue of notifications, settlements
// and actions, handed over strictly in arrival order by a goroutine that
// exists only while the queue is not empty (its workQueue, workqueue.go).
// An unread listener therefore holds back the later notifications of its
// own channel, as upstream's order requires, and nothing else: the drainer
// goes on reading, other channels go on, and RPC replies (which are not
// notifications) reach their callers at once. What waits is charged to the
// budget.
//
// When nothing waits, the producer (the channel's dispatcher, or the
// drainer for the connection) hands a notification over itself, without
// waiting, if every listener has room: no goroutine, no queue, the cost of
// a non-blocking send.
//
// A close waits for what came before it: channel.close from the broker,
// the channel.close-ok that ends Channel.Close, and the connection's
// shutdown each run only once the notifications queued before them were
// handed over, or once closeWait has passed; then what is still queued is
// dropped, so that a listener nobody reads delays a close by closeWait
// plus the rest of one retry slice (50 ms) at most (upstream: 5 s per
// notification): a blocked hand-over looks at the close's deadline
// between slices (TestUnitOutboxSliceSchedule pins it).

// Slices of a blocked hand-over. A blocked send holds the owner's notify
// lock (read side) for at most one slice, then lets go and tries again. The
// lock is what makes a send race-free against upstream closing the
// listener chan; the bound is what keeps anyone who takes that lock for
// writing (Notify* registration, Close, shutdown) from waiting on a user
// who does not read: they wait at most outboxMaxSlice.
const (
	outboxMinSlice = time.Millisecond
	outboxMaxSlice = 50 * time.Millisecond
)

// outItem is one entry of an outbox: notifications for the listeners of
// one frame, deferred confirmations to settle, or an action.
type outItem interface {
	// handOver offers what is left of the item and reports whether it is
	// all handed over. It waits at most one slice for a listener that has
	// no room, holding the owner's notify lock for reading meanwhile.
	handOver(o *outbox, slice time.Duration, timer **time.Timer) (done bool)
	// drop gives up on what is left for listeners (closed, or a close
	// deadline passed). Settlements and actions still run: they never
	// wait on a user, and a DeferredConfirmation must always settle.
	drop()
	// cost is what the item is charged to the budget while it waits.
	cost() int64
	// kind names the listeners the item waits for, for Stats and the
	// warnings; "" for actions, which wait for nobody.
	kind() ListenerKind
}

// queuedItem is an item, what it is charged, its sequence number, and the
// time it was queued (monoNow).
type queuedItem struct {
	it   outItem
	at   int64
	seq  uint64
	cost int64
}

// monoBase anchors monoNow.
var monoBase = time.Now()

// monoNow is a monotonic clock reading in nanoseconds, cheaper to keep per
// queued item than a time.Time.
func monoNow() int64 { return int64(time.Since(monoBase)) }

// outbox hands one owner's notifications over in arrival order: a
// workQueue whose goroutine hands its items over, and never parks.
//
// One goroutine at a time produces into an outbox: the channel's
// dispatcher (one job at a time), or the drainer for the connection's. So
// when the producer finds the outbox idle it stays idle until the
// producer itself queues something, which is what lets it hand a
// notification over inline.
type outbox struct {
	workQueue[queuedItem] // the front is being handed over

	lock       *sync.RWMutex // the owner's notifyM, held by upstream while it closes listeners
	closed     *bool         // the owner's noNotify, guarded by lock
	closeWait  time.Duration // how long a close waits for the notifications before it
	retired    func()        // runs under outer when the outbox empties, if set
	sliceTimer *time.Timer   // a blocked hand-over's slice (the goroutine's only)

	// Under mu: queued counts the items ever queued, which numbers them
	// (queuedItem.seq); items numbered up to dropThrough are dropped once
	// dropAt has passed: a close is waiting behind them.
	queued      uint64
	dropThrough uint64
	dropAt      time.Time

	// For Stats, the warnings and the stall policy (watch.go).
	channel uint16         // the owner's channel id, 0 for the connection
	bytes   int64          // what the waiting items are charged, under mu
	notes   int            // how many notifications the waiting items hold, under mu
	watch   *watcher       // nil when nobody watches
	forget  func(any) bool // closes and unregisters a dropped listener, under lock (write); false if it was not registered
	dropped map[any]bool   // listeners given up on, under lock
}

// queue appends an item, charged to the budget, and starts the hand-over
// goroutine if none runs. It returns the item's sequence number.
func (o *outbox) queue(it outItem) uint64 {
	cost, at := it.cost(), monoNow()
	o.mu.Lock()
	o.queued++
	seq := o.queued
	start := o.putLocked(queuedItem{it, at, seq, cost}, cost)
	o.bytes += cost
	o.notes += itemCount(it)
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

// dropBefore makes the items queued before seq (0: every item queued so
// far) droppable once wait has passed: seq is a close, which must not wait
// longer for them. Once they are done the deadline is forgotten
// (doneItem), so that it never applies to a later close.
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

// runItem hands an item over, one slice at a time (the slice doubling up
// to outboxMaxSlice), until it is all handed over or has waited past a
// close's deadline: then it is dropped.
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

// doneItem uncounts a handed-over (or dropped) item, and forgets a close's
// deadline once no item it applies to is left.
func (o *outbox) doneItem(q queuedItem) int64 {
	o.bytes -= q.cost
	o.notes -= itemCount(q.it)
	if q.seq >= o.dropThrough {
		o.dropThrough, o.dropAt = 0, time.Time{}
	}
	return q.cost
}

// retire runs the owner's retired, and never keeps the goroutine: an
// outbox goroutine exists only while items wait.
func (o *outbox) retire() bool {
	if o.retired != nil {
		o.retired()
	}
	return false
}

// notifyAllInOrder hands vs to every listener in ls, in order, after
// everything queued before them: inline when the outbox is idle and every
// listener has room, else through the outbox.
func notifyAllInOrder[T any](o *outbox, ls []chan T, cost func(T) int64, vs ...T) {
	if len(ls) == 0 || len(vs) == 0 {
		return
	}
	n := notes[T]{ls: ls, vs: vs, costOf: cost}
	if o.idle() && n.handOver(o, 0, nil) {
		return
	}
	// Copied, so that the inline attempt above allocates nothing.
	left := new(notes[T])
	*left = n
	left.of = kindOf[T]()
	o.queue(left)
}

// inOrder runs f after everything queued before it: at once when the
// outbox is idle. It returns f's sequence number, 0 if it ran at once.
func (o *outbox) inOrder(f func()) uint64 {
	if o.idle() {
		f()
		return 0
	}
	return o.queue(action(f))
}

// closeInOrder runs a close after everything queued before it, but waits
// for the queued notifications at most closeWait: then they are dropped.
func (o *outbox) closeInOrder(f func()) {
	if seq := o.inOrder(f); seq > 0 {
		o.dropBefore(seq, o.closeWait)
	}
}

// notes are the values of one frame for the listeners of one kind, and how
// far their hand-over has got: values in order, each to every listener.
type notes[T any] struct {
	ls     []chan T
	vs     []T
	li, vi int // next: vs[vi] to ls[li]
	costOf func(T) int64
	of     ListenerKind
}

func (n *notes[T]) kind() ListenerKind { return n.of }

// kindOf names the listeners of values of type T.
func kindOf[T any]() ListenerKind {
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

// handOver offers what is left of the values, waiting at most one slice
// for a listener that has no room (see outItem). With slice 0 it waits for
// nothing, not even the notify lock: the producer's inline attempt.
func (n *notes[T]) handOver(o *outbox, slice time.Duration, timer **time.Timer) bool {
	if slice > 0 {
		o.lock.RLock()
	} else if !o.lock.TryRLock() {
		return false
	}
	defer o.lock.RUnlock()
	if *o.closed {
		return true // upstream has closed the listeners: nothing to hand over
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
			if slice == 0 || !n.sendWithin(slice, timer) {
				return false
			}
		}
	}
	return true
}

// sendWithin sends the next value to the next listener, waiting at most
// slice, and reports whether it did.
func (n *notes[T]) sendWithin(slice time.Duration, timer **time.Timer) bool {
	select {
	case n.ls[n.li] <- n.vs[n.vi]:
		stopTimer(*timer)
		return true
	case <-startTimer(timer, slice):
		return false
	}
}

func (n *notes[T]) drop() {}

// action is work that must run in order with the notifications: closing a
// cancelled consumer's deliveries, or a channel's close.
type action func()

func (a action) handOver(*outbox, time.Duration, **time.Timer) bool {
	a()
	return true
}

func (a action) drop()              { a() }
func (a action) cost() int64        { return frameCost }
func (a action) kind() ListenerKind { return "" }

// settlement resolves DeferredConfirmations taken out of their channel's
// set when the confirm arrived, once the notifications before it were
// handed over.
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

// take removes from the set and returns the DeferredConfirmations that a
// confirm of tag (and of every tag before it, if multiple) settles, so
// that they can settle later, in order, and nothing else settles them
// (upstream's reset and Close nack only what is still in the set). For
// multiple, the set holds no tag below from and none above last that a
// confirm of tag settles, so only those tags are looked up: the cost is
// the number of tags the confirm covers, not the size of the set, which
// behind an unread listener is large (upstream's ConfirmMultiple walks
// the whole set).
func (d *deferredConfirmations) take(from, last, tag uint64, multiple bool) []*DeferredConfirmation {
	d.m.Lock()
	defer d.m.Unlock()
	if !multiple {
		dc, found := d.confirmations[tag]
		if !found {
			return nil
		}
		delete(d.confirmations, tag)
		return []*DeferredConfirmation{dc}
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
