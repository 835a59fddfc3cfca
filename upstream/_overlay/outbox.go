// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"fmt"
	"sync"
	"sync/atomic"
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
// exists only while the queue is not empty. An unread listener therefore
// holds back the later notifications of its own channel, as upstream's
// order requires, and nothing else: the drainer goes on reading, other
// channels go on, and RPC replies (which are not notifications) reach
// their callers at once. What waits is charged to the budget.
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

// queuedItem is an item with the time it was queued (monoNow).
type queuedItem struct {
	it outItem
	at int64
}

// monoBase anchors monoNow.
var monoBase = time.Now()

// monoNow is a monotonic clock reading in nanoseconds, cheaper to keep per
// queued item than a time.Time.
func monoNow() int64 { return int64(time.Since(monoBase)) }

// outbox hands one owner's notifications over in arrival order.
//
// One goroutine at a time produces into an outbox: the channel's
// dispatcher (one job at a time), or the drainer for the connection's. So
// when the producer finds the outbox idle it stays idle until the
// producer itself queues something, which is what lets it hand a
// notification over inline.
type outbox struct {
	lock      *sync.RWMutex // the owner's notifyM, held by upstream while it closes listeners
	closed    *bool         // the owner's noNotify, guarded by lock
	budget    *budget
	work      *workCount    // the connection's queued work, which a shutdown waits for
	closeWait time.Duration // how long a close waits for the notifications before it

	mu     sync.Mutex
	items  runQueue[queuedItem] // the front is being handed over
	queued uint64               // items ever queued; an item's sequence number is queued after it
	// Items numbered up to dropThrough are dropped once dropAt has
	// passed: a close is waiting behind them.
	dropThrough uint64
	dropAt      time.Time
	retired     func() // runs under outer when the outbox empties, if set
	outer       *sync.Mutex

	// For Stats, the warnings and the stall policy (watch.go).
	channel uint16         // the owner's channel id, 0 for the connection
	bytes   int64          // what the waiting items are charged, under mu
	notes   int            // how many notifications the waiting items hold, under mu
	watch   *watcher       // nil when nobody watches
	forget  func(any) bool // closes and unregisters a dropped listener, under lock (write); false if it was not registered
	dropped map[any]bool   // listeners given up on, under lock
}

// idle reports whether nothing waits and no goroutine hands anything over.
// Only the producer may act on a true answer (see outbox).
func (o *outbox) idle() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.items.running
}

// queue appends an item, charged to the budget, and starts the hand-over
// goroutine if none runs. It returns the item's sequence number.
func (o *outbox) queue(it outItem) uint64 {
	cost := it.cost()
	o.budget.charge(cost)
	o.work.add(1)
	at := monoNow()
	o.mu.Lock()
	start := o.items.put(queuedItem{it, at})
	o.queued++
	seq := o.queued
	o.bytes += cost
	o.notes += itemCount(it)
	var h outboxHead
	if o.watch != nil {
		h = o.headLocked(at)
	}
	o.mu.Unlock()
	if start {
		go o.run()
	}
	if o.watch != nil {
		o.watch.queued(o, h)
	}
	return seq
}

// dropBefore makes the items queued before seq droppable once wait has
// passed: seq is a close, which must not wait longer for them.
func (o *outbox) dropBefore(seq uint64, wait time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at := time.Now().Add(wait)
	if seq-1 > o.dropThrough {
		o.dropThrough = seq - 1
	}
	if o.dropAt.IsZero() || at.Before(o.dropAt) {
		o.dropAt = at
	}
}

// dropQueued makes everything queued so far droppable now.
func (o *outbox) dropQueued() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropThrough = o.queued
	o.dropAt = time.Now()
}

// mustDrop reports whether the item numbered seq has waited past a close's
// deadline.
func (o *outbox) mustDrop(seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return seq <= o.dropThrough && !time.Now().Before(o.dropAt)
}

func (o *outbox) run() {
	slice := outboxMinSlice
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		it, seq, at, ok := o.next()
		if !ok {
			return
		}
		for !it.handOver(o, slice, &timer) {
			if o.mustDrop(seq) {
				it.drop()
				break
			}
			if o.watch != nil {
				o.watch.waiting(o, it, at)
			}
			if slice *= 2; slice > outboxMaxSlice {
				slice = outboxMaxSlice
			}
		}
		slice = outboxMinSlice
		cost := it.cost()
		o.mu.Lock()
		o.items.drop()
		o.bytes -= cost
		o.notes -= itemCount(it)
		o.mu.Unlock()
		o.budget.release(cost)
		o.work.add(-1)
	}
}

// next returns the item at the head of the queue, or retires the
// goroutine when there is none.
func (o *outbox) next() (outItem, uint64, int64, bool) {
	if o.outer != nil {
		o.outer.Lock()
		defer o.outer.Unlock()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	q, ok := o.items.front()
	if !ok {
		if o.dropThrough >= o.queued {
			o.dropThrough, o.dropAt = 0, time.Time{}
		}
		if o.retired != nil {
			o.retired()
		}
		return nil, 0, 0, false
	}
	waiting := uint64(len(o.items.queued()))
	return q.it, o.queued - waiting + 1, q.at, true
}

// notifyAllInOrder hands vs to every listener in ls, in order, after
// everything queued before them: inline when the outbox is idle and every
// listener has room, else through the outbox.
func notifyAllInOrder[T any](o *outbox, ls []chan T, cost func(T) int64, vs ...T) {
	if len(ls) == 0 || len(vs) == 0 {
		return
	}
	n := notes[T]{ls: ls, vs: vs, costOf: cost}
	if o.idle() && n.tryNow(o) {
		return
	}
	// Copied, so that the inline attempt above allocates nothing.
	left := new(notes[T])
	*left = n
	left.of = kindOf[T]()
	o.queue(left)
}

// inOrder runs f after everything queued before it: at once when the
// outbox is idle.
func (o *outbox) inOrder(f func()) {
	if o.idle() {
		f()
		return
	}
	o.queue(action(f))
}

// closeInOrder runs a close after everything queued before it, but waits
// for the queued notifications at most closeWait: then they are dropped.
func (o *outbox) closeInOrder(f func()) {
	if o.idle() {
		f()
		return
	}
	seq := o.queue(action(f))
	o.dropBefore(seq, o.closeWait)
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

// tryNow hands over what it can without waiting or blocking on the notify
// lock, and reports whether that was everything.
func (n *notes[T]) tryNow(o *outbox) bool {
	if !o.lock.TryRLock() {
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
			default:
				return false
			}
		}
	}
	return true
}

func (n *notes[T]) handOver(o *outbox, slice time.Duration, timer **time.Timer) bool {
	o.lock.RLock()
	defer o.lock.RUnlock()
	if *o.closed {
		return true
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
			if *timer == nil {
				*timer = time.NewTimer(slice)
			} else {
				(*timer).Reset(slice)
			}
			select {
			case n.ls[n.li] <- n.vs[n.vi]:
				if !(*timer).Stop() {
					<-(*timer).C
				}
			case <-(*timer).C:
				return false
			}
		}
	}
	return true
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

// workCount counts a connection's queued work (dispatcher jobs and outbox
// items), so that a shutdown can wait until what arrived before it has
// been handed over.
type workCount struct {
	n       atomic.Int64
	waiters atomic.Pointer[chan struct{}]
}

func (w *workCount) add(delta int64) {
	if w.n.Add(delta) == 0 && w.waiters.Load() != nil {
		if p := w.waiters.Swap(nil); p != nil {
			close(*p)
		}
	}
}

// waitIdle waits until no work is queued, or until deadline. It reports
// whether the work got done.
func (w *workCount) waitIdle(deadline time.Time) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var woken chan struct{}
		if p := w.waiters.Load(); p != nil {
			woken = *p
		} else {
			ch := make(chan struct{})
			if !w.waiters.CompareAndSwap(nil, &ch) {
				continue
			}
			woken = ch
		}
		if w.n.Load() == 0 {
			return true
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return false
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-woken:
		case <-timer.C:
			return w.n.Load() == 0
		}
	}
}
