// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Unit tests of the read budget (budget.go): no broker, no socket.

// isClosed reports whether c is closed, without waiting.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestUnitBudgetWaterMarks pins the hysteresis between the marks: over()
// turns true only above high (high itself is not over), and the below chan
// it returns closes only once usage is back at low, not when it merely
// falls under high. A reader that resumed at high would pause again at the
// next frame; one that never got the chan closed would never read again.
func TestUnitBudgetWaterMarks(t *testing.T) {
	b := newBudget(1000, 400)
	b.charge(1000)
	if over, below := b.over(); over || below != nil {
		t.Fatalf("at the high mark: over() = %v, %v; want false, nil", over, below)
	}
	b.charge(1)
	over, below := b.over()
	if !over || below == nil {
		t.Fatalf("above the high mark: over() = %v, %v; want true and a chan", over, below)
	}
	if _, again := b.over(); again != below {
		t.Fatal("a second over() while paused returned another chan: waiters would not wake together")
	}
	b.release(1) // back at high
	if over, _ := b.over(); over {
		t.Fatal("over() still true at the high mark")
	}
	if isClosed(below) {
		t.Fatal("below closed at the high mark: the reader would resume before usage fell to low")
	}
	b.release(600) // 400: the low mark
	if !isClosed(below) {
		t.Fatalf("below still open at the low mark (used %d)", b.usedNow())
	}
	// Going over again makes a new chan: the closed one must not release
	// the next pause at once.
	b.charge(601)
	over, next := b.over()
	if !over || next == below || isClosed(next) {
		t.Fatalf("second pause: over %v, same chan %v, closed %v", over, next == below, isClosed(next))
	}
	b.release(601)
	if !isClosed(next) || b.usedNow() != 400 {
		t.Fatalf("second pause: below closed %v, used %d", isClosed(next), b.usedNow())
	}
}

// TestUnitBudgetChargeWhileOverKeepsTheChan pins that charges while a
// reader waits never replace or close its chan, and that one release to
// the low mark, however it comes, wakes it: the chan is closed by the
// release that reaches low, from whichever goroutine releases.
func TestUnitBudgetChargeWhileOverKeepsTheChan(t *testing.T) {
	b := newBudget(100, 50)
	b.charge(150)
	_, below := b.over()
	b.charge(50) // 200
	b.release(120)
	if isClosed(below) {
		t.Fatal("below closed at 80, above the low mark")
	}
	if _, again := b.over(); again != nil {
		t.Fatal("over() at 80 returned a chan")
	}
	b.charge(30) // 110: over again, the same pause
	if _, again := b.over(); again != below {
		t.Fatal("a pause that never ended got a new chan: the first waiter would never wake")
	}
	b.release(60)
	if !isClosed(below) || b.usedNow() != 50 {
		t.Fatalf("below closed %v at used %d", isClosed(below), b.usedNow())
	}
}

// TestUnitBudgetPinnedBytesNeverPause pins pin/unpin: bytes of a message
// still being assembled count in usedNow (they are memory), but never make
// the reader pause, and they do not keep a pause going either, since only
// reading more can release them.
func TestUnitBudgetPinnedBytesNeverPause(t *testing.T) {
	b := newBudget(100, 50)
	b.pin(1000)
	if over, _ := b.over(); over {
		t.Fatal("pinned bytes made the reader pause: it would wait for itself")
	}
	if b.usedNow() != 1000 {
		t.Fatalf("usedNow = %d with 1000 pinned", b.usedNow())
	}
	b.charge(101)
	over, below := b.over()
	if !over {
		t.Fatal("101 charged bytes over a high mark of 100 did not pause")
	}
	b.release(51) // 50 charged, 1000 pinned
	if !isClosed(below) {
		t.Fatal("pinned bytes kept the reader paused")
	}
	b.unpin(1000)
	if used, pinned := budgetUsed(b); used != 50 || pinned != 0 {
		t.Fatalf("after unpin: used %d, pinned %d; want 50, 0", used, pinned)
	}
	if s := b.snapshot(time.Now()); s.Limit != 100 || s.Used != 50 || s.Paused || s.Pauses != 0 {
		t.Fatalf("snapshot = %+v", s)
	}
}

// TestUnitBudgetPauseAccounting pins the Stats of pauses on the fake
// clock: a pause under way counts in PausedTotal up to now, an ended one
// for exactly its length, and pauseEnded without a pause is a no-op that
// returns 0 (the drainer calls it after every wait, paused or not).
func TestUnitBudgetPauseAccounting(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		b := newBudget(10, 5)
		if d := b.pauseEnded(time.Now()); d != 0 {
			t.Fatalf("pauseEnded without a pause = %s", d)
		}
		b.pauseBegan(time.Now())
		time.Sleep(3 * time.Second)
		if s := b.snapshot(time.Now()); !s.Paused || s.Pauses != 1 || s.PausedTotal != 3*time.Second {
			t.Fatalf("3s into the first pause: %+v", s)
		}
		time.Sleep(2 * time.Second)
		if d := b.pauseEnded(time.Now()); d != 5*time.Second {
			t.Fatalf("first pause lasted %s, want 5s", d)
		}
		time.Sleep(time.Hour) // not paused: nothing accrues
		if s := b.snapshot(time.Now()); s.Paused || s.Pauses != 1 || s.PausedTotal != 5*time.Second {
			t.Fatalf("between pauses: %+v", s)
		}
		b.pauseBegan(time.Now())
		time.Sleep(1500 * time.Millisecond)
		if d := b.pauseEnded(time.Now()); d != 1500*time.Millisecond {
			t.Fatalf("second pause lasted %s, want 1.5s", d)
		}
		if d := b.pauseEnded(time.Now()); d != 0 {
			t.Fatalf("a second pauseEnded = %s, want 0", d)
		}
		if s := b.snapshot(time.Now()); s.Paused || s.Pauses != 2 || s.PausedTotal != 6500*time.Millisecond {
			t.Fatalf("after two pauses: %+v", s)
		}
	})
}

// TestUnitBudgetReaderResumesAtLowMark runs the drainer's use of the
// budget, a reader that charges what it queues and waits on below when
// over, against a consumer that releases one item per second. It pins the
// exact times: the reader pauses when the sixth item passes the high mark
// and reads again at 4s, when the fourth release reaches the low mark, not
// at 1s when usage fell back to high. Several waiters on one pause are
// released together.
func TestUnitBudgetReaderResumesAtLowMark(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		const item = 100
		b := newBudget(5*item, 2*item)
		start := time.Now()
		var (
			mu      sync.Mutex
			resumed []time.Duration
		)
		queued := make(chan struct{}, 10)
		reader := func() {
			for i := 0; i < 6; i++ {
				b.charge(item)
				queued <- struct{}{}
			}
			over, below := b.over()
			if !over {
				t.Error("600 bytes over a high mark of 500 did not pause")
				return
			}
			b.pauseBegan(time.Now())
			var wg sync.WaitGroup
			for w := 0; w < 3; w++ { // e.g. the reader and two DrainEvents callers
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-below
					mu.Lock()
					resumed = append(resumed, time.Since(start))
					mu.Unlock()
				}()
			}
			<-below
			if d := b.pauseEnded(time.Now()); d != 4*time.Second {
				t.Errorf("the pause lasted %s, want 4s", d)
			}
			wg.Wait()
		}
		go reader()
		for i := 0; i < 6; i++ {
			<-queued
			time.Sleep(time.Second)
			b.release(item)
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(resumed) != 3 {
			t.Fatalf("%d of 3 waiters released", len(resumed))
		}
		for _, at := range resumed {
			if at != 4*time.Second {
				t.Errorf("a waiter was released at %s, want 4s (the low mark)", at)
			}
		}
		if s := b.snapshot(time.Now()); s.Used != 0 || s.Pauses != 1 || s.PausedTotal != 4*time.Second {
			t.Errorf("at the end: %+v", s)
		}
	})
}
