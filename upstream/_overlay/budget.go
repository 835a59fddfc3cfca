// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"sync"
	"time"
)

// budget counts the bytes read that still wait for a user: queued dispatcher jobs, outbox items
// (notifications), deliveries in consumer inboxes, and the partial body of a message being read
// (pinned). Each is charged when queued and released when its user took it.
//
// Above high the drainer stops reading the socket, so TCP backpressure reaches the broker
// instead of memory growing, until the count falls to low. The two marks (the drainer sets low to
// half of high) keep reading from pausing and resuming at every delivery around one mark.
//
// Pinned bytes are counted in used, for Stats, but never decide a pause: only reading more can
// complete a message and so release its pinned bytes. Were they counted, a message bigger than
// the room left would pause reading, and reading would wait for a release that only reading
// could bring.
//
// Legacy keeps one for its deliveries only, with marks it never reaches (math.MaxInt64), for
// Stats: legacy's caller paces its reads, so there is nothing to pause.
//
// mu is a leaf lock: a budget calls nothing while holding it, so it may be charged under any
// queue's lock.
type budget struct {
	high, low int64

	mu     sync.Mutex
	used   int64
	pinned int64 // part of used that only reading more can release
	// below's chan is made by over for a reader about to pause, and closed at low.
	below wakeup

	pauses      uint64        // for Stats
	pausedTotal time.Duration // of the pauses that ended
	pausedSince time.Time     // zero unless paused now
}

// newBudget returns a budget over which reading pauses, above high until low.
func newBudget(high, low int64) *budget { return &budget{high: high, low: low} }

// charge and release count n bytes queued for a user, and taken by one.
func (b *budget) charge(n int64)  { b.add(n, 0) }
func (b *budget) release(n int64) { b.add(-n, 0) }

// pin charges a message being assembled, never a pause's cause: only reading on unpins it.
func (b *budget) pin(n int64)   { b.add(n, n) }
func (b *budget) unpin(n int64) { b.add(-n, -n) }

// add counts n bytes more used, pinned of them pinned, and wakes a paused reader (closes
// below's chan) once usage less pinned is at most low.
func (b *budget) add(n, pinned int64) {
	b.mu.Lock()
	b.used += n
	b.pinned += pinned
	if b.used-b.pinned <= b.low {
		b.below.wake() // only a load while nobody waits
	}
	b.mu.Unlock()
}

// over reports whether reading should pause; if so, below is closed once usage fell to low. The
// chan is made only here, by a reader about to wait on it, so that add, on every charge, has
// nothing to close while nobody waits.
func (b *budget) over() (over bool, below <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used-b.pinned <= b.high {
		return false, nil
	}
	return true, b.below.wait()
}

// pauseBegan records that the reader stopped reading for the budget.
func (b *budget) pauseBegan(now time.Time) {
	b.mu.Lock()
	b.pauses++
	b.pausedSince = now
	b.mu.Unlock()
}

// pauseEnded records that the reader reads again; it returns the pause.
func (b *budget) pauseEnded(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pausedSince.IsZero() {
		return 0
	}
	d := now.Sub(b.pausedSince)
	b.pausedTotal += d
	b.pausedSince = time.Time{}
	return d
}

// snapshot is the budget's part of Stats at now; a pause under way counts up to now.
func (b *budget) snapshot(now time.Time) BudgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := BudgetStats{Limit: b.high, Used: b.used, Pauses: b.pauses, PausedTotal: b.pausedTotal}
	s.Paused = !b.pausedSince.IsZero()
	if s.Paused {
		s.PausedTotal += now.Sub(b.pausedSince)
	}
	return s
}

// usedNow reports the bytes charged now, pinned ones included.
func (b *budget) usedNow() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
