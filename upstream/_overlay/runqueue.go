// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import "slices"

// runQueue is the slice behind a queue whose taker runs, or is awake, only while items wait: a
// workQueue's goroutine, or a consumer inbox's taker (inbox.go). The owner's lock guards it.
//
// running is the hand-shake between producer and taker: put reports whether the taker must be
// started or woken (running was false), and front, finding nothing, sets running false, so that
// the next put wakes it. Both run under the owner's lock, so a put never misses a taker that is
// about to stop, and a burst of puts wakes the taker once.
type runQueue[T any] struct {
	items   []T // items[head:] wait; items[head] is the next
	head    int
	running bool
}

// keepItems: an emptied queue keeps a slice up to this big for the next burst, cheaper than
// growing one again; a bigger one is let go, so a past spike does not hold memory.
const keepItems = 1024

// put appends v and reports whether the taker must be started or woken.
func (q *runQueue[T]) put(v T) (start bool) {
	if len(q.items) == cap(q.items) && q.head >= len(q.items)/2 {
		// Slide down rather than grow: a queue that never empties must not keep all it ever
		// held. Half the slice is free (head ≥ len/2), so the copy is paid for by the puts.
		// Delete zeroes the slots it frees, so the slice holds no pointer to a done item.
		q.items = slices.Delete(q.items, 0, q.head)
		q.head = 0
	}
	q.items = append(q.items, v)
	start = !q.running
	q.running = true
	return start
}

// front returns the next item, which stays queued until drop. On none, the taker counts as
// stopped, so that the next put starts or wakes it again.
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

// drop takes the next item out, once it is done with, zeroing its slot so the slice holds no
// pointer to it.
func (q *runQueue[T]) drop() {
	var zero T
	q.items[q.head] = zero
	q.head++
}

// queued returns the waiting items, the next first.
func (q *runQueue[T]) queued() []T { return q.items[q.head:] }
