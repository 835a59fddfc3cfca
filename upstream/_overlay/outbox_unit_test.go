// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Unit tests of the outbox (outbox.go) and workCount (workqueue.go) on
// synctest's fake clock; outbox_test.go has the first ones, on the real
// clock. No broker, no socket. The helpers (testOwner, newTestOutbox, intCost, budgetUsed)
// are outbox_test.go's.

// TestUnitOutboxSliceSchedule pins the hand-over's slices for a listener
// nobody reads: 1 ms, doubling, capped at outboxMaxSlice (50 ms), so the
// retries end at 1, 3, 7, 15, 31, 63, 113, 163... ms. A close waits for the
// notifications before it until closeWait and runs at the first slice end
// after it (the drop is checked between slices only), so it runs exactly
// there: the cap is what bounds a close's overrun, and a cap that grew
// past 50 ms would show as a later close.
func TestUnitOutboxSliceSchedule(t *testing.T) {
	for _, tc := range []struct {
		closeWait, want time.Duration
	}{
		{0, time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{2 * time.Millisecond, 3 * time.Millisecond},
		{5 * time.Millisecond, 7 * time.Millisecond},
		{40 * time.Millisecond, 63 * time.Millisecond},
		{63 * time.Millisecond, 63 * time.Millisecond},
		{100 * time.Millisecond, 113 * time.Millisecond},
		{time.Second, 1013 * time.Millisecond},
	} {
		inBubble(t, func(t *testing.T) {
			var owner testOwner
			o, b, w := newTestOutbox(&owner, tc.closeWait)
			unread := make(chan int)
			start := time.Now()
			notifyAllInOrder(o, []chan int{unread}, intCost, 1, 2)
			var ranAt time.Duration
			o.closeInOrder(func() { ranAt = time.Since(start) })
			if !w.waitIdle(start.Add(time.Hour)) {
				t.Fatal("the outbox did not empty")
			}
			if ranAt != tc.want {
				t.Errorf("closeWait %s: the close ran at %s, want %s", tc.closeWait, ranAt, tc.want)
			}
			if used, _ := budgetUsed(b); used != 0 {
				t.Errorf("budget still charged %d bytes", used)
			}
		})
	}
}

// TestUnitOutboxSliceRestartsPerItem pins that the slice starts again at
// 1 ms for each item: an item handed over after a long wait does not pass
// its 50 ms slice on to the next, so a close behind that next item runs
// 1 ms after its deadline, not up to 50.
func TestUnitOutboxSliceRestartsPerItem(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var owner testOwner
		o, _, w := newTestOutbox(&owner, 0)
		slow := make(chan int)
		start := time.Now()
		notifyAllInOrder(o, []chan int{slow}, intCost, 1)
		notifyAllInOrder(o, []chan int{slow}, intCost, 2)
		time.Sleep(200 * time.Millisecond) // the first item's slice is at its cap
		if v := <-slow; v != 1 {
			t.Fatalf("got %d, want 1", v)
		}
		var ranAt time.Duration
		o.closeInOrder(func() { ranAt = time.Since(start) })
		if !w.waitIdle(start.Add(time.Hour)) {
			t.Fatal("the outbox did not empty")
		}
		if want := 201 * time.Millisecond; ranAt != want {
			t.Errorf("the close ran at %s, want %s (a fresh 1 ms slice)", ranAt, want)
		}
	})
}

// TestUnitOutboxNotifyLockWriterWaitsOneSlice pins why the hand-over is
// sliced: it holds the owner's notify lock (read side) while it waits for a
// listener, and upstream takes that lock for writing to register or close
// listeners. A writer must get it at the end of the slice under way, at
// most outboxMaxSlice later, however long the listener stays unread. Here
// the slice is at its 50 ms cap (ends at 163, 213 ms): a writer arriving
// at 200 ms gets the lock at 213 ms, marks the listeners closed as
// upstream's shutdown does, and the hand-over then gives the item up.
//
// The writer runs outside the bubble: a goroutine blocked on a mutex is not
// durably blocked, so inside the bubble it would stop the fake clock and
// the slice would never end. The bubble polls for it at 1 ms steps.
func TestUnitOutboxNotifyLockWriterWaitsOneSlice(t *testing.T) {
	var owner testOwner
	start, done := make(chan struct{}), make(chan struct{})
	var startOnce sync.Once
	release := func() { startOnce.Do(func() { close(start) }) }
	t.Cleanup(func() { release(); <-done })
	var locked atomic.Bool
	go func() {
		defer close(done)
		<-start
		owner.notifyM.Lock()
		locked.Store(true)
		owner.noNotify = true
		owner.notifyM.Unlock()
	}()
	inBubble(t, func(t *testing.T) {
		o, b, w := newTestOutbox(&owner, time.Hour)
		unread := make(chan int)
		notifyAllInOrder(o, []chan int{unread}, intCost, 1)
		time.Sleep(200 * time.Millisecond)
		arrived := time.Now()
		release()
		// Until the writer waits: then new readers are refused.
		for o.lock.TryRLock() {
			o.lock.RUnlock()
			runtime.Gosched()
		}
		for !locked.Load() {
			time.Sleep(time.Millisecond)
		}
		// The writer got the lock at 213 ms; it is seen at the first poll
		// after (the clock stands still while the hand-over waits for it).
		if waited := time.Since(arrived); waited < 13*time.Millisecond || waited > 14*time.Millisecond {
			t.Errorf("the writer waited %s for the notify lock, want 13 ms (the rest of a 50 ms slice)", waited)
		}
		<-done
		if !w.waitIdle(time.Now().Add(time.Millisecond)) {
			t.Error("the item for a closed listener was not given up")
		}
		if used, _ := budgetUsed(b); used != 0 {
			t.Errorf("budget still charged %d bytes", used)
		}
	})
}

// TestUnitOutboxOrderAcrossListeners pins upstream's order on the fake
// clock. A NotifyReturn listener is unread until 5 s: the acks queued after
// its return wait for it, even for a listener with room (roomy), and then
// everything is handed over at 5 s in arrival order. The values of one
// frame go value by value, each to every listener of the frame (roomy,
// ackA, ackB), as upstream's loop over the listeners does, so one unread
// listener holds back the others of its kind too. The reader selects on
// every chan at once and the outbox offers one value at a time, so the
// order it records is the outbox's. Another owner's outbox, on the same
// budget and work count, is not held up at all.
func TestUnitOutboxOrderAcrossListeners(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var owner, other testOwner
		o, b, w := newTestOutbox(&owner, time.Hour)
		o2 := &outbox{lock: &other.notifyM, closed: &other.noNotify, workQueue: workQueue[queuedItem]{budget: b, work: w}, closeWait: time.Hour}
		start := time.Now()
		returns := make(chan string)
		roomy := make(chan int, 10)
		ackA, ackB := make(chan int), make(chan int)
		notifyAllInOrder(o, []chan string{returns}, stringCost1, "r1")
		notifyAllInOrder(o, []chan int{roomy, ackA, ackB}, intCost, 1, 2)
		notifyAllInOrder(o, []chan string{returns}, stringCost1, "r2")
		var actionAt time.Duration
		o.inOrder(func() { actionAt = time.Since(start) })

		otherAcks := make(chan int, 1)
		notifyAllInOrder(o2, []chan int{otherAcks}, intCost, 9)
		select {
		case <-otherAcks:
		default:
			t.Error("another owner's notification waited for this owner's unread listener")
		}

		time.Sleep(5 * time.Second)
		if n := len(roomy); n != 0 {
			t.Fatalf("%d acks reached a listener with room before the return queued ahead of them was read", n)
		}
		var got []string
		for i := 0; i < 6; i++ {
			var s string
			select {
			case v := <-returns:
				s = "return " + v
			case v := <-ackA:
				s = fmt.Sprint("ackA ", v)
			case v := <-ackB:
				s = fmt.Sprint("ackB ", v)
			}
			got = append(got, fmt.Sprintf("%s@%s", s, time.Since(start)))
		}
		if !w.waitIdle(time.Now().Add(time.Second)) {
			t.Fatal("the outbox did not empty")
		}
		want := []string{"return r1@5s", "ackA 1@5s", "ackB 1@5s", "ackA 2@5s", "ackB 2@5s", "return r2@5s"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("hand-overs %v, want %v", got, want)
		}
		if len(roomy) != 2 || actionAt != 5*time.Second {
			t.Errorf("roomy got %d values (want 2); the action ran at %s (want 5s)", len(roomy), actionAt)
		}
		if used, _ := budgetUsed(b); used != 0 {
			t.Errorf("budget still charged %d bytes", used)
		}
	})
}

// TestUnitOutboxDropQueued pins dropQueued, what a shutdown calls once its
// deadline has passed: everything queued so far is given up at its next
// slice end (the head at the end of its current slice, each later one
// after its first 1 ms slice), settlements still settle and actions still
// run, every charge is released, and what is queued after the call is not
// dropped: it waits for its listener as usual.
func TestUnitOutboxDropQueued(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var owner testOwner
		o, b, w := newTestOutbox(&owner, time.Hour)
		unread := make(chan int)
		start := time.Now()
		notifyAllInOrder(o, []chan int{unread}, intCost, 1) // charged 1
		notifyAllInOrder(o, []chan int{unread}, intCost, 2) // 1
		dc := &DeferredConfirmation{DeliveryTag: 1, done: make(chan struct{})}
		o.queue(&settlement{dcs: []*DeferredConfirmation{dc}, ack: true}) // frameCost
		var ranAt time.Duration
		o.inOrder(func() { ranAt = time.Since(start) }) // frameCost
		if used, _ := budgetUsed(b); used != 2+2*frameCost {
			t.Fatalf("budget charged %d, want %d", used, 2+2*frameCost)
		}
		if n := w.n.Load(); n != 4 {
			t.Fatalf("work count %d, want 4", n)
		}

		time.Sleep(10 * time.Millisecond) // the head is in its 8 ms slice (7 to 15 ms)
		o.dropQueued()
		if !w.waitIdle(time.Now().Add(time.Second)) {
			t.Fatal("dropQueued left work queued")
		}
		// Head dropped at 15 ms, the second item after its 1 ms slice.
		if want := 16 * time.Millisecond; ranAt != want {
			t.Errorf("the action behind the dropped items ran at %s, want %s", ranAt, want)
		}
		if !dc.Acked() {
			t.Error("a dropped settlement left its DeferredConfirmation unsettled")
		}
		if used, _ := budgetUsed(b); used != 0 {
			t.Errorf("budget still charged %d bytes", used)
		}

		// Queued after the drop: waits for its listener, however long.
		notifyAllInOrder(o, []chan int{unread}, intCost, 3)
		time.Sleep(time.Minute)
		if v := <-unread; v != 3 {
			t.Fatalf("got %d, want 3", v)
		}
		if !w.waitIdle(time.Now().Add(time.Second)) {
			t.Error("the outbox did not empty")
		}
	})
}

// TestUnitOutboxCloseDeadlineEndsWithItsItems pins that a close's
// deadline applies only to the items queued before it: once they are
// done it is forgotten, so a later close waits its own closeWait (1 s:
// the close runs at 1013 ms, the slice end after it), not the rest of an
// earlier close's. A dropQueued that finds nothing queued sets none.
func TestUnitOutboxCloseDeadlineEndsWithItsItems(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var owner testOwner
		o, _, w := newTestOutbox(&owner, time.Second)
		unread := make(chan int)
		for i := 0; i < 2; i++ {
			start := time.Now()
			notifyAllInOrder(o, []chan int{unread}, intCost, i)
			var ranAt time.Duration
			o.closeInOrder(func() { ranAt = time.Since(start) })
			if !w.waitIdle(start.Add(time.Hour)) {
				t.Fatal("the outbox did not empty")
			}
			if want := 1013 * time.Millisecond; ranAt != want {
				t.Errorf("close %d ran at %s, want %s", i, ranAt, want)
			}
			o.dropQueued() // nothing queued: no deadline for what follows
		}
	})
}

// TestUnitWorkCountWaitIdleTimes pins workCount.waitIdle on the fake
// clock, as a shutdown uses it: it returns true at the very moment the last
// queued item is handed over, false exactly at its deadline while work is
// left, false at once for a deadline already past, and every waiter wakes
// on the same transition to zero. A second wait after a wake-up waits for
// new work again (the consumed wake-up chan is not reused).
func TestUnitWorkCountWaitIdleTimes(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var owner testOwner
		o, _, w := newTestOutbox(&owner, time.Hour)
		ls := make(chan int)
		start := time.Now()
		notifyAllInOrder(o, []chan int{ls}, intCost, 1)

		if w.waitIdle(start.Add(-time.Second)) || time.Since(start) != 0 {
			t.Fatalf("a past deadline: waited %s, or reported idle", time.Since(start))
		}
		if w.waitIdle(start.Add(2 * time.Second)) {
			t.Fatal("waitIdle reported idle with an item unread")
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Fatalf("waitIdle gave up at %s, want its 2s deadline", d)
		}

		var wg sync.WaitGroup
		woke := make([]time.Duration, 3)
		for i := range woke {
			i := i // upstream's go.mod predates per-iteration loop variables
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !w.waitIdle(start.Add(time.Hour)) {
					t.Error("waitIdle gave up before the item was read")
				}
				woke[i] = time.Since(start)
			}()
		}
		time.Sleep(5 * time.Second) // read at 7 s
		<-ls
		wg.Wait()
		for i, at := range woke {
			if at != 7*time.Second {
				t.Errorf("waiter %d woke at %s, want 7s, when the item was handed over", i, at)
			}
		}

		w.add(1)
		go func() {
			time.Sleep(3 * time.Second)
			w.add(-1)
		}()
		if !w.waitIdle(start.Add(time.Hour)) {
			t.Fatal("second wait gave up")
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Errorf("second wait returned at %s, want 10s", d)
		}
		synctest.Wait()
	})
}

// TestUnitCloseAndRemoveKeepsQueuedList pins that dropping a listener leaves the list a queued
// hand-over holds as it was: an in-place delete would shift it and zero its last entry, a nil
// chan that the hand-over would wait on for ever.
func TestUnitCloseAndRemoveKeepsQueuedList(t *testing.T) {
	a, b, c := make(chan int, 1), make(chan int, 1), make(chan int, 1)
	held := []chan int{a, b, c}
	rest, found := closeAndRemove(held, b)
	if !found || len(rest) != 2 || rest[0] != a || rest[1] != c {
		t.Fatalf("closeAndRemove = %v, %v; want [a c], true", rest, found)
	}
	if held[0] != a || held[1] != b || held[2] != c {
		t.Fatalf("the held list changed under its holder: %v", held)
	}
	if _, open := <-b; open {
		t.Fatal("the dropped listener is not closed")
	}
}
