// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"sync"
	"sync/atomic"
	"time"
)

// workQueue runs items in order on a goroutine of its own, so that the drainer never waits
// for them. The first item of a burst starts it; it retires when none is left or, if its handler
// keeps it, parks for linger. Each item is charged to the budget until it ran and counted in work.
type workQueue[T any] struct {
	budget *budget
	work   *workCount // if set, counts the queued items for a shutdown to wait on
	// outer, if set, is taken before mu on an empty queue, so retire runs under it (as do a dispatcher's puts).
	outer  *sync.Mutex
	linger time.Duration          // how long an empty queue's goroutine parks; 0: it retires
	ended  func() <-chan struct{} // if set, closed when a parked goroutine must retire

	mu     sync.Mutex
	items  runQueue[T]   // the front runs, and leaves the queue once done
	parked bool          // the goroutine waits for wake
	wake   chan struct{} // made with the first park; holds at most one wake-up token
	timer  *time.Timer   // the linger, reused across parks (goroutine only)
}

// workHandler: runItem runs with no lock held; doneItem under mu once the item left the queue,
// returning its charge; retire under outer (if set) and mu on an empty queue: may the goroutine park?
type workHandler[T any] interface {
	runItem(T)
	doneItem(T) (cost int64)
	retire() (keep bool)
}

// putLocked queues v (q.mu held), charged, waking a parked goroutine; true: go q.loop once unlocked.
func (q *workQueue[T]) putLocked(v T, cost int64) (start bool) {
	q.budget.charge(cost)
	if q.work != nil {
		q.work.add(1)
	}
	if start = q.items.put(v); start && q.parked {
		q.wakeLocked()
		return false
	}
	return start
}

// wakeLocked wakes the parked goroutine, under q.mu, counting it as running.
func (q *workQueue[T]) wakeLocked() {
	q.parked, q.items.running = false, true
	q.wake <- struct{}{} // buffered, and empty while parked
}

// loop is the queue's goroutine: it runs the items, then parks or retires.
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
		if q.work != nil {
			q.work.add(-1)
		}
	}
}

// next returns the front item; on none, under outer then mu, the handler retires: park or end?
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

// parkUntilPut is true once a put or unpark woke the goroutine, false (it retires) at linger or end.
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

// idle reports whether no item waits or runs (parked counts as idle). Only
// the one who puts may act on true: it holds until it puts or unparks.
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

// stopTimer stops t and drains a sent value: a Reset starts afresh with either asynctimerchan.
func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

// serialQueue runs a channel dispatcher's jobs (parked for dispatcherLinger), or channel 0's.
type serialQueue struct {
	workQueue[queuedJob]
	retired func() (keep bool) // runs under outer when the queue empties: may it park?
	// handleJob runs the jobs with no run func, by value: a pointer to the loop's copy would escape.
	handleJob func(queuedJob)
}

// queuedJob is a func to run, or what handleJob takes (needing no closure).
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

// workCount counts a connection's queued jobs and outbox items, for a shutdown to wait for.
type workCount struct {
	n atomic.Int64
	wakeup
}

// add counts delta more items, waking the waiters when none is left.
func (w *workCount) add(delta int64) {
	if w.n.Add(delta) == 0 {
		w.wake()
	}
}

// waitIdle waits until no work is queued (true) or deadline passed.
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
