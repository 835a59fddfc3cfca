// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

// runQueue is the slice behind a queue whose taker runs, or is awake, only
// while items wait. Its three users: the workQueue (workqueue.go) of a
// serialQueue and of an outbox, whose taker is the queue's goroutine, and
// a consumer's inbox (inbox.go), whose taker hands its deliveries to the
// application. put reports whether the taker must be started or woken;
// front, on an empty queue, counts the taker as gone (retired or parked),
// so that the next put reports it again. The owner's lock guards it.
type runQueue[T any] struct {
	items   []T // items[head:] wait; items[head] is the next
	head    int
	running bool
}

// keepItems is the capacity up to which an emptied queue keeps its slice
// for the next burst: the drainer queues a job per method or message, and
// reallocating per burst costs more than the frames' own parsing. Bigger
// slices, left by a burst the budget allowed, are dropped so they do not
// stay pinned.
const keepItems = 1024

// put appends v and reports whether the owner must start or wake the
// taker: it is not running.
func (q *runQueue[T]) put(v T) (start bool) {
	if len(q.items) == cap(q.items) && q.head >= len(q.items)/2 {
		// Full, and at least half of it already taken: slide the waiting
		// items down rather than grow, so that a queue that never
		// empties does not keep every item it ever held.
		n := copy(q.items, q.items[q.head:])
		var zero T
		for i := n; i < len(q.items); i++ {
			q.items[i] = zero // upstream's go.mod predates clear
		}
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, v)
	start = !q.running
	q.running = true
	return start
}

// front returns the next item, leaving it in the queue (drop takes it
// out). When none waits it reports false, and the taker no longer counts
// as running: the next put reports that it must be started or woken.
func (q *runQueue[T]) front() (T, bool) {
	if q.head == len(q.items) {
		q.head = 0
		if cap(q.items) > keepItems {
			q.items = nil
		} else {
			q.items = q.items[:0]
		}
		q.running = false
		var zero T
		return zero, false
	}
	return q.items[q.head], true
}

// drop takes the next item out of the queue, once it is done with.
func (q *runQueue[T]) drop() {
	var zero T
	q.items[q.head] = zero
	q.head++
}

// queued returns the items in the queue, the next first, for the owner to
// look at under its lock.
func (q *runQueue[T]) queued() []T { return q.items[q.head:] }
