// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"sync"
	"time"
)

// budget counts the bytes that a read path has read from the socket and
// that still wait for a user: in the drainer, frames queued for a
// channel's dispatcher, the body read so far of a message still being
// read (pinned), notifications queued for a listener, and deliveries
// waiting in a consumer's inbox (inbox.go) until its consumer loop hands
// them over or drops them. When the count passes the high
// mark, the drainer stops reading the socket, so TCP backpressure reaches
// the broker instead of memory growing; it reads again once the count falls
// under the low mark. Legacy mode keeps one for its consumers' deliveries
// only, with marks it never reaches (math.MaxInt64): it never pauses its
// reads for it, and Stats reports it.
type budget struct {
	high, low int64

	mu     sync.Mutex
	used   int64
	pinned int64         // part of used that only reading more can release
	belowC chan struct{} // closed when used falls to low or below, while someone waits

	// For Stats: the reader's pauses.
	pauses      uint64
	pausedTotal time.Duration // of the pauses that ended
	pausedSince time.Time     // zero unless paused now
}

// newBudget returns a budget over which reading pauses, above high until low.
func newBudget(high, low int64) *budget { return &budget{high: high, low: low} }

// charge and release count n bytes queued for a user, and taken by one.
func (b *budget) charge(n int64) {
	b.mu.Lock()
	b.used += n
	b.mu.Unlock()
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.wakeBelow()
	b.mu.Unlock()
}

// pin charges n bytes of a message still being assembled by the reader.
// They count as memory, but they never make the reader pause: nobody but
// the reader itself can release them, by reading the rest of the message,
// so pausing for them would wait forever.
func (b *budget) pin(n int64) {
	b.mu.Lock()
	b.used += n
	b.pinned += n
	b.mu.Unlock()
}

// unpin releases what pin charged, once the message is complete (and is
// charged again as it is queued) or dropped.
func (b *budget) unpin(n int64) {
	b.mu.Lock()
	b.used -= n
	b.pinned -= n
	b.wakeBelow()
	b.mu.Unlock()
}

// wakeBelow closes belowC once usage, pinned bytes aside, is at the low
// mark. b.mu is held.
func (b *budget) wakeBelow() {
	if b.used-b.pinned <= b.low && b.belowC != nil {
		close(b.belowC)
		b.belowC = nil
	}
}

// over reports whether reading should pause. When it returns true, below is
// closed once usage has fallen to the low mark.
func (b *budget) over() (over bool, below <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used-b.pinned <= b.high {
		return false, nil
	}
	if b.belowC == nil {
		b.belowC = make(chan struct{})
	}
	return true, b.belowC
}

// pauseBegan records that the reader stopped reading for the budget.
func (b *budget) pauseBegan(now time.Time) {
	b.mu.Lock()
	b.pauses++
	b.pausedSince = now
	b.mu.Unlock()
}

// pauseEnded records that the reader reads again, and returns how long
// it paused.
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

// snapshot is the budget's part of Stats at now.
func (b *budget) snapshot(now time.Time) BudgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := BudgetStats{
		Limit:       b.high,
		Used:        b.used,
		Paused:      !b.pausedSince.IsZero(),
		Pauses:      b.pauses,
		PausedTotal: b.pausedTotal,
	}
	if s.Paused {
		s.PausedTotal += now.Sub(b.pausedSince)
	}
	return s
}

// usedNow reports the bytes charged now.
func (b *budget) usedNow() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
