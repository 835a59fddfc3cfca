// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

// runQueue is the slice behind a queue whose taker runs, or is awake, only while items wait: a
// workQueue's goroutine, or a consumer inbox's taker (inbox.go). The owner's lock guards it.
type runQueue[T any] struct {
	items   []T // items[head:] wait; items[head] is the next
	head    int
	running bool
}

// keepItems: an emptied queue keeps a slice this big for the next burst (cheaper than reallocating).
const keepItems = 1024

// put appends v and reports whether the taker must be started or woken.
func (q *runQueue[T]) put(v T) (start bool) {
	if len(q.items) == cap(q.items) && q.head >= len(q.items)/2 {
		// Slide down rather than grow: a queue that never empties must not keep all it ever held.
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

// front returns the next item, queued until drop; on none, the taker counts as gone for the next put.
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

// drop takes the next item out, once it is done with.
func (q *runQueue[T]) drop() {
	var zero T
	q.items[q.head] = zero
	q.head++
}

// queued returns the waiting items, the next first.
func (q *runQueue[T]) queued() []T { return q.items[q.head:] }
