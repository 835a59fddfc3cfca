// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"sync"
	"sync/atomic"
	"time"
)

// workQueue runs items of type T in order, one at a time, on a goroutine
// of its own, so that the drainer never waits for them (a channel's
// methods take its lock or write to the socket; notifications wait for
// their listeners). The goroutine is started by the first item of a burst,
// and retires when none is left or, if its handler keeps it, parks for
// linger, for the next burst. Each item is charged to the budget until it
// ran (the drainer stops reading while the budget is over its high mark)
// and counted in work. The handler says what an item does: serialQueue
// (below) runs jobs, the outbox (outbox.go) hands notifications over.
type workQueue[T any] struct {
	budget *budget
	work   *workCount // if set, counts the queued items for a shutdown to wait on
	// outer, when set, is taken (before mu) when the goroutine finds the
	// queue empty, so that the handler's retire runs under it: a
	// dispatcher's jobs are put under it, so none is in flight, and an
	// outbox's retire reads the dispatcher's state, which it guards.
	outer *sync.Mutex
	// linger is how long the goroutine stays parked once the queue is
	// empty (zero: it retires at once); ended, when set, returns a chan
	// closed when a parked goroutine must retire at once.
	linger time.Duration
	ended  func() <-chan struct{}

	mu     sync.Mutex
	items  runQueue[T]   // the front runs, and leaves the queue once done
	parked bool          // the goroutine waits for wake
	wake   chan struct{} // made with the first park; holds at most the token of one wake-up
	timer  *time.Timer   // the linger, reused across parks (goroutine only)
}

// workHandler is what a workQueue's items do. runItem runs the item at the
// front on the queue's goroutine, with no lock held; doneItem runs under
// the queue's lock once the item has left the queue, and returns what it
// was charged; retire runs under outer (if set) and the queue's lock when
// the queue is empty, and reports whether the goroutine may park.
type workHandler[T any] interface {
	runItem(T)
	doneItem(T) (cost int64)
	retire() (keep bool)
}

// put queues v, charged cost until it ran, and starts or wakes the
// goroutine if none is running.
func (q *workQueue[T]) put(v T, cost int64, h workHandler[T]) {
	q.mu.Lock()
	start := q.putLocked(v, cost)
	q.mu.Unlock()
	if start {
		go q.loop(h)
	}
}

// putLocked appends v, with q.mu held, charges and counts it, and wakes
// the goroutine if it is parked. It reports whether the caller must start
// one (go q.loop) once it has unlocked.
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

// wakeLocked wakes the parked goroutine, with q.mu held. It counts as
// running from now on, so that a put before it looks at the queue does
// not start a second one.
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

// next returns the item at the front. When there is none it takes outer
// (before mu), lets the handler retire, and reports whether the goroutine
// parks (marked parked) rather than retires.
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

// parkUntilPut waits for a put (or unpark), and reports true once one woke
// the goroutine; false when the linger passed or the connection ended
// first, and the goroutine retires (the next put starts another).
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
		// Woken as it gave up: the token is for this goroutine.
		<-q.wake
		return true
	}
	q.parked = false
	return false
}

// idle reports whether no item waits or runs (a parked goroutine counts
// as idle). Only the one who puts may act on a true answer, which stays
// true until it puts (or unparks): the drainer asks a dispatcher under
// outer, and a channel's dispatcher (or the drainer, for the connection)
// its outbox.
func (q *workQueue[T]) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.items.running
}

// unpark wakes the goroutine if it is parked: it looks at the queue again,
// and retires if the handler no longer keeps it.
func (q *workQueue[T]) unpark() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.parked {
		q.wakeLocked()
	}
}

// startTimer starts *t for d, making it the first time, and returns its
// chan: a goroutine's timer, reused.
func startTimer(t **time.Timer, d time.Duration) <-chan time.Time {
	if *t == nil {
		*t = time.NewTimer(d)
	} else {
		(*t).Reset(d)
	}
	return (*t).C
}

// stopTimer stops t and drains a value it sent already, so that a Reset
// starts afresh under either timer implementation (GODEBUG asynctimerchan).
func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

// serialQueue runs jobs on a workQueue: a channel dispatcher's methods and
// messages (drainer_dispatch.go), which park for dispatcherLinger after a
// burst, since starting a goroutine per burst cost the drain workload
// 7–13% of its CPU (newproc); and the connection's channel-0 work
// (conn0Work), which retires at once and is not counted in work.
type serialQueue struct {
	workQueue[queuedJob]
	// retired runs under outer when the queue empties; it reports whether
	// the queue is still wanted, and so may park.
	retired func() (keep bool)
	// handleJob runs the jobs that have no run function. It takes the job
	// by value: a pointer to the loop's copy would move it to the heap, an
	// allocation per job.
	handleJob func(queuedJob)
}

// queuedJob is a function to run, or what the queue's handleJob takes:
// a method frame, a complete content message, or a delivery. The drainer
// queues one job per method or complete message, and those need no
// closure.
type queuedJob struct {
	run  func()
	f    frame              // a method that starts no content
	msg  messageWithContent // a complete content message (not a fast basic.deliver)
	del  *Delivery          // a complete basic.deliver from the fast path
	cost int64
}

// push queues run, charged cost, starting or waking the queue's goroutine.
func (q *serialQueue) push(cost int64, run func()) {
	q.pushJob(queuedJob{run: run, cost: cost})
}

// pushJob queues a job, charged its cost until it ran.
func (q *serialQueue) pushJob(job queuedJob) { q.put(job, job.cost, q) }

// runItem, doneItem and retire make serialQueue the handler of its
// workQueue: a job runs its function or handleJob, and retired (if set)
// says whether the goroutine may park.
func (q *serialQueue) runItem(job queuedJob) {
	if job.run != nil {
		job.run()
	} else {
		q.handleJob(job)
	}
}

func (q *serialQueue) doneItem(job queuedJob) int64 { return job.cost }
func (q *serialQueue) retire() bool                 { return q.retired == nil || q.retired() }

// workCount counts a connection's queued work (dispatcher jobs, outbox
// items), so that a shutdown can wait until what arrived before it has
// been done.
type workCount struct {
	n       atomic.Int64
	waiters atomic.Pointer[chan struct{}]
}

// add counts delta items more, waking the waiters when none is left.
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
	for {
		woken := w.waiters.Load()
		if woken == nil {
			ch := make(chan struct{})
			if !w.waiters.CompareAndSwap(nil, &ch) {
				continue
			}
			woken = &ch
		}
		if w.n.Load() == 0 {
			return true
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline)) // one for the whole wait
			defer timer.Stop()
		}
		select {
		case <-*woken:
		case <-timer.C:
			return w.n.Load() == 0
		}
	}
}
