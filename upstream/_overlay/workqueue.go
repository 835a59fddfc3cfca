// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"sync"
	"sync/atomic"
	"time"
)

// workQueue runs items in order on a goroutine of its own, so that the drainer never waits
// for them. The first item of a burst starts the goroutine; when none is left it retires, or,
// if its handler keeps it, parks for linger, so that a burst of bursts shares one goroutine.
// Each item is charged to the budget until it ran, and counted in work for a shutdown to wait
// on. A channel's dispatcher (serialQueue) and every outbox are workQueues.
//
// The nesting under outer. A channel's dispatcher and its outbox retire together: when the
// channel is closed, whichever of the two goroutines finds itself idle last, and sees the other
// idle too, removes the dispatcher from drainConn.dispatchers (newDispatcher's retired funcs).
// To decide, each holds its own mu, so that no put makes it busy meanwhile, and looks at the
// other's: the dispatcher nests its outbox's mu under its own, and the outbox nests the
// dispatcher's under its own, the two locks in both orders. Alone, that is a lock order
// inversion: each goroutine would hold its lock and wait for the other's. It is safe because
// both nest only under outer, drainConn.mu, taken first (next): one decides at a time.
//
// drainConn.mu also makes retiring atomic with a put: drainConn.dispatch looks the dispatcher up
// and puts under it, so a job can neither reach a dispatcher just removed from the map (it would
// start a goroutine there, beside the new dispatcher made for the next frame: out of frame
// order) nor be missed by the retire check.
// Never nest a dispatcher's mu and its outbox's without holding drainConn.mu.
type workQueue[T any] struct {
	budget *budget
	work   *workCount // if set, counts the queued items for a shutdown to wait on
	// outer, if set, is taken before mu when the queue is found empty, so that retire runs
	// under it (as do a dispatcher's puts): drainConn.mu, for a dispatcher and its outbox.
	outer  *sync.Mutex
	linger time.Duration          // how long an empty queue's goroutine parks; 0: it retires
	ended  func() <-chan struct{} // if set, closed when a parked goroutine must retire

	mu     sync.Mutex
	items  runQueue[T]   // the front runs, and leaves the queue once done
	parked bool          // the goroutine waits for wake
	wake   chan struct{} // made with the first park; holds at most one wake-up token
	timer  *time.Timer   // the linger, reused across parks (the goroutine's only)
}

// workHandler is what a workQueue's owner supplies. runItem runs with no lock held, so an item
// may block (on a listener, a write) without holding up puts; doneItem runs under mu once the
// item left the queue, returning its charge; retire runs under outer (if set) and mu when the
// queue is empty, and says whether the goroutine may park (keep) rather than end.
type workHandler[T any] interface {
	runItem(T)
	doneItem(T) (cost int64)
	retire() (keep bool)
}

// putLocked queues v (q.mu held), charged, waking a parked goroutine. It returns true when no
// goroutine runs or is parked: the caller starts one (go q.loop) once it let go of mu.
func (q *workQueue[T]) putLocked(v T, cost int64) (start bool) {
	q.budget.charge(cost)
	q.work.add(1)
	start = q.items.put(v)
	if start && q.parked {
		q.wakeLocked()
		return false
	}
	return start
}

// wakeLocked wakes the parked goroutine, under q.mu, counting it as running at once, so that a
// put meanwhile does not start a second one.
func (q *workQueue[T]) wakeLocked() {
	q.parked = false
	q.items.running = true
	q.wake <- struct{}{} // buffered, and empty while parked
}

// loop is the queue's goroutine: it runs the items, then parks or retires. An item stays at the
// front while it runs, so that the queue counts as busy (idle is false) until it is done.
func (q *workQueue[T]) loop(h workHandler[T]) {
	for {
		v, ok, park := q.next(h)
		if !ok {
			if park && q.parkUntilPut() {
				continue
			}
			return
		}
		h.runItem(v)
		q.mu.Lock()
		q.items.drop()
		cost := h.doneItem(v)
		q.mu.Unlock()
		q.budget.release(cost)
		q.work.add(-1)
	}
}

// next returns the front item. On none, it asks the handler whether to retire, under outer then
// mu (workQueue's doc says why outer), and reports whether to park. mu is let go before outer
// is taken: outer comes first in the lock order, and a put may slip in meanwhile, which the
// second look (front, under both) sees.
func (q *workQueue[T]) next(h workHandler[T]) (v T, ok, park bool) {
	q.mu.Lock()
	if len(q.items.queued()) == 0 && q.outer != nil {
		q.mu.Unlock()
		q.outer.Lock()
		defer q.outer.Unlock()
		q.mu.Lock()
	}
	defer q.mu.Unlock()
	if v, ok = q.items.front(); ok || !h.retire() || q.linger <= 0 {
		return v, ok, false
	}
	q.parked = true
	if q.wake == nil {
		q.wake = make(chan struct{}, 1)
	}
	return v, false, true
}

// parkUntilPut waits, with no lock held, for a put or an unpark (true: run again), or for the
// linger or the generation's end (false: the goroutine retires). A wake-up that races the
// timeout is not lost: whoever woke it cleared parked under mu and sent the token.
func (q *workQueue[T]) parkUntilPut() bool {
	var ended <-chan struct{}
	if q.ended != nil {
		ended = q.ended()
	}
	select {
	case <-q.wake:
		stopTimer(q.timer)
		return true
	case <-startTimer(&q.timer, q.linger):
	case <-ended:
		stopTimer(q.timer)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.parked {
		<-q.wake // woken as it gave up: the token is for this goroutine
		return true
	}
	q.parked = false
	return false
}

// idle reports whether no item waits or runs (parked counts as idle). A queue turns busy only
// by a put or an unpark, so only its producer may act on true, and only where no unpark can
// come meanwhile (a dispatcher's are both under drainConn.mu, as is drainConn.dispatch's look).
func (q *workQueue[T]) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.items.running
}

// unpark wakes a parked goroutine to look at the queue again.
func (q *workQueue[T]) unpark() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.parked {
		q.wakeLocked()
	}
}

// startTimer starts a goroutine's reused timer *t for d and returns its chan.
func startTimer(t **time.Timer, d time.Duration) <-chan time.Time {
	if *t == nil {
		*t = time.NewTimer(d)
	} else {
		(*t).Reset(d)
	}
	return (*t).C
}

// stopTimer stops t and drains a value already sent, so that the next Reset starts afresh with
// either setting of GODEBUG asynctimerchan (Go before 1.23 kept a fired value in the chan).
func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

// serialQueue runs a channel dispatcher's jobs (parked for dispatcherLinger), or channel 0's
// (conn0Work), in the order the reader queued them.
type serialQueue struct {
	workQueue[queuedJob]
	retired func() (keep bool) // runs under outer when the queue empties: may it park?
	// handleJob runs the jobs with no run func, taking them by value: a pointer to the loop's
	// copy would make it escape, an allocation per job.
	handleJob func(queuedJob)
}

// queuedJob is a func to run, or a frame for handleJob: a frame needs no closure, so a queued
// delivery or method costs no allocation beyond the frame's own.
type queuedJob struct {
	run  func()
	f    frame              // a method that starts no content
	msg  messageWithContent // a complete content message (not a fast basic.deliver)
	del  *Delivery          // a complete basic.deliver from the fast path
	cost int64
}

// push queues run, charged cost.
func (q *serialQueue) push(cost int64, run func()) { q.pushJob(queuedJob{run: run, cost: cost}) }

// pushJob queues a job, charged its cost until it ran.
func (q *serialQueue) pushJob(job queuedJob) {
	q.mu.Lock()
	start := q.putLocked(job, job.cost)
	q.mu.Unlock()
	if start {
		go q.loop(q)
	}
}

// runItem, doneItem and retire make serialQueue a workHandler.
func (q *serialQueue) runItem(job queuedJob) {
	if job.run != nil {
		job.run()
	} else {
		q.handleJob(job)
	}
}

func (q *serialQueue) doneItem(job queuedJob) int64 { return job.cost }
func (q *serialQueue) retire() bool                 { return q.retired == nil || q.retired() }

// workCount counts a connection's queued jobs and outbox items, for a shutdown to wait for: a
// flush must not end the connection while notifications are still being handed over.
type workCount struct {
	n atomic.Int64
	wakeup
}

// add counts delta more items, waking the waiters when none is left; a nil w counts nothing
// (a workQueue without a count).
func (w *workCount) add(delta int64) {
	if w != nil && w.n.Add(delta) == 0 {
		w.wake()
	}
}

// waitIdle waits until no work is queued (true) or deadline passed (false). It waits on the
// wakeup, taken before each look at the count, so a wake between the look and the wait is kept.
func (w *workCount) waitIdle(deadline time.Time) bool {
	var timer *time.Timer
	for {
		woken := w.wait() // before the check, so no wake is lost
		if w.n.Load() == 0 {
			return true
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline)) // one for the whole wait
			defer timer.Stop()
		}
		select {
		case <-woken:
		case <-timer.C:
			return w.n.Load() == 0
		}
	}
}
