// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Unit tests of serialQueue and its workQueue (workqueue.go), the goroutine
// behind each channel's dispatcher and the connection's channel-0 work: no
// broker, no socket, on synctest's fake clock.

// TestUnitSerialQueueRunsInOrderOneAtATime pins that jobs run in push
// order, one at a time: 90 jobs of 1 ms each (and 10 for handleJob) are
// done at exactly 90 ms (run side by side they would be done at 1 ms), the
// jobs' unlocked
// appends pass the race detector, and jobs without a run function reach
// handleJob, by value, in the same order. Each job's cost stays charged to
// the budget until it ran, and workCount.waitIdle returns the moment the
// last one did.
func TestUnitSerialQueueRunsInOrderOneAtATime(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var (
			work    workCount
			order   []int // appended by the jobs, without a lock
			running atomic.Int32
		)
		b := newBudget(1<<20, 1<<19)
		q := &serialQueue{workQueue: workQueue[queuedJob]{budget: b, work: &work}}
		q.handleJob = func(job queuedJob) {
			order = append(order, int(job.f.channel()))
			if job.cost != 7 {
				t.Errorf("handleJob got cost %d, want 7", job.cost)
			}
		}
		start := time.Now()
		for i := 0; i < 100; i++ {
			i := i // upstream's go.mod predates per-iteration loop variables
			if i%10 == 9 {
				q.pushJob(queuedJob{f: &methodFrame{ChannelId: uint16(i)}, cost: 7})
				continue
			}
			q.push(10, func() {
				if n := running.Add(1); n != 1 {
					t.Errorf("%d jobs running at once", n)
				}
				time.Sleep(time.Millisecond)
				order = append(order, i)
				running.Add(-1)
			})
		}
		if used := b.usedNow(); used != 90*10+10*7 {
			t.Fatalf("budget charged %d for the queued jobs, want %d", used, 90*10+10*7)
		}
		if !work.waitIdle(start.Add(time.Hour)) {
			t.Fatal("the jobs did not run")
		}
		if d := time.Since(start); d != 90*time.Millisecond {
			t.Errorf("90 jobs of 1 ms were done at %s, want 90ms: they did not run one at a time", d)
		}
		if len(order) != 100 {
			t.Fatalf("%d of 100 jobs ran", len(order))
		}
		for i, v := range order {
			if v != i {
				t.Fatalf("job %d ran in place %d: %v", v, i, order)
			}
		}
		if used := b.usedNow(); used != 0 {
			t.Errorf("budget still charged %d", used)
		}
	})
}

// TestUnitSerialQueueRetiresAndRestarts pins the on-demand goroutine: it
// retires once the queue is empty (retired runs once per burst, under the
// outer lock, and the queue reports not running), and the next push starts
// a new one. A job pushed while the goroutine runs, even by a job itself,
// is run by that same goroutine after the jobs before it: no second
// goroutine, no second retirement. The bubble ending without a deadlock
// also shows that no idle goroutine is left waiting.
func TestUnitSerialQueueRetiresAndRestarts(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var outer sync.Mutex
		var retirements int
		q := &serialQueue{workQueue: workQueue[queuedJob]{budget: newBudget(1<<20, 1<<19), outer: &outer}}
		q.retired = func() bool {
			if outer.TryLock() {
				outer.Unlock()
				t.Error("retired ran without the outer lock: a push could race it")
			}
			retirements++
			return true
		}
		var order []string
		pushLocked := func(name string, run func()) { // outer held
			q.push(1, func() {
				order = append(order, name)
				if run != nil {
					run()
				}
			})
		}
		push := func(name string, run func()) {
			outer.Lock()
			pushLocked(name, run)
			outer.Unlock()
		}

		outer.Lock() // both queued before the goroutine may look for more
		pushLocked("a", nil)
		pushLocked("b", func() { push("c", nil) }) // c: pushed by the queue's own goroutine
		outer.Unlock()
		synctest.Wait()
		outer.Lock()
		if !q.idle() || retirements != 1 {
			t.Errorf("after the first burst: running %v, %d retirements; want false, 1", !q.idle(), retirements)
		}
		outer.Unlock()

		time.Sleep(time.Second)
		push("d", func() { time.Sleep(time.Second) })
		push("e", nil)
		outer.Lock()
		if q.idle() {
			t.Error("a push to an idle queue did not start its goroutine")
		}
		outer.Unlock()
		time.Sleep(500 * time.Millisecond)
		push("f", nil)          // while d runs: same goroutine
		time.Sleep(time.Second) // d ends at 2 s, then e and f run
		synctest.Wait()
		outer.Lock()
		defer outer.Unlock()
		if !q.idle() || retirements != 2 {
			t.Errorf("after the second burst: running %v, %d retirements; want false, 2", !q.idle(), retirements)
		}
		if got := fmt.Sprint(order); got != "[a b c d e f]" {
			t.Errorf("ran %s, want [a b c d e f]", got)
		}
	})
}

// TestUnitSerialQueueConcurrentPushes pins that a push racing the
// goroutine's retirement is never lost: either the retiring goroutine
// still pops it or the push starts a new one. Eight producers push 200
// jobs each, pausing now and then so that the queue empties and restarts
// many times, once with pushes under an outer lock (as a channel's
// dispatcher is fed) and once without (the connection's channel-0 queue).
// Every job runs exactly once, each producer's jobs in its order, and the
// budget and work count end at zero.
func TestUnitSerialQueueConcurrentPushes(t *testing.T) {
	for _, c := range []struct {
		withOuter bool
		linger    time.Duration
	}{{true, 0}, {false, 0}, {true, 2 * time.Millisecond}, {false, 3 * time.Millisecond}} {
		withOuter := c.withOuter
		inBubble(t, func(t *testing.T) {
			const producers, jobs = 8, 200
			var (
				work  workCount
				outer sync.Mutex
				ran   [producers][]int // appended by the jobs, without a lock
			)
			b := newBudget(1<<20, 1<<19)
			q := &serialQueue{workQueue: workQueue[queuedJob]{budget: b, work: &work}}
			var retirements atomic.Int32
			q.retired = func() bool { retirements.Add(1); return true }
			q.linger = c.linger // parks, and retires after a pause longer than it
			if withOuter {
				q.outer = &outer
			}
			var wg sync.WaitGroup
			for p := 0; p < producers; p++ {
				p := p
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := 0; j < jobs; j++ {
						j := j
						if withOuter {
							outer.Lock()
						}
						q.push(3, func() { ran[p] = append(ran[p], j) })
						if withOuter {
							outer.Unlock()
						}
						if j%(p+3) == 0 {
							time.Sleep(time.Duration(p+1) * time.Millisecond)
						}
					}
				}()
			}
			wg.Wait()
			if !work.waitIdle(time.Now().Add(time.Second)) {
				t.Fatal("jobs left queued")
			}
			synctest.Wait()
			for p := range ran {
				if len(ran[p]) != jobs {
					t.Fatalf("outer %v: producer %d: %d of %d jobs ran", withOuter, p, len(ran[p]), jobs)
				}
				for j, v := range ran[p] {
					if v != j {
						t.Fatalf("outer %v: producer %d: job %d ran in place %d", withOuter, p, v, j)
					}
				}
			}
			time.Sleep(c.linger) // the goroutine retires
			if used := b.usedNow(); used != 0 || !q.idle() {
				t.Errorf("outer %v: budget %d, running %v at the end", withOuter, used, !q.idle())
			}
			if r := retirements.Load(); r < 2 {
				t.Errorf("outer %v: the queue retired %d times: the test did not exercise restarts", withOuter, r)
			}
		})
	}
}

// TestUnitSerialQueueMemory pins the queue's memory: a queue that never
// empties (a job always waiting behind the one running) slides its jobs
// down instead of growing without bound, an emptied queue keeps a small
// slice for the next burst, and drops one grown past keepItems so that a
// burst the budget allowed does not stay pinned.
func TestUnitSerialQueueMemory(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		q := &serialQueue{workQueue: workQueue[queuedJob]{budget: newBudget(1<<30, 1<<29)}}
		capacity := func() int {
			q.mu.Lock()
			defer q.mu.Unlock()
			return cap(q.items.items)
		}
		job := func() { time.Sleep(time.Millisecond) }
		for i := 0; i < 10; i++ {
			q.push(1, job)
		}
		for i := 0; i < 5000; i++ { // one more per job run: 10 stay queued
			time.Sleep(time.Millisecond)
			q.push(1, job)
		}
		if c := capacity(); c > 64 {
			t.Errorf("a queue 10 deep kept a slice of capacity %d after 5010 jobs", c)
		}
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		if c := capacity(); c == 0 {
			t.Error("an emptied small queue dropped its slice: the next burst allocates again")
		}

		for i := 0; i < 2*keepItems; i++ {
			q.push(1, job)
		}
		time.Sleep(3 * keepItems * time.Millisecond)
		synctest.Wait()
		if c := capacity(); c != 0 {
			t.Errorf("an emptied queue kept a slice of capacity %d, above keepItems (%d)", c, keepItems)
		}
	})
}

// TestUnitSerialQueueParks pins the dispatcher's linger (issue #18): after
// a burst the goroutine parks, a push within the linger wakes that same
// goroutine (no new one), it retires once the linger passes without a
// push, at once when ended closes, and when retired says the queue is no
// longer wanted. An unpark wakes it to look again, and it counts as
// running until it has: a push meanwhile starts no second goroutine (two
// would run jobs side by side). The bubble ending without a deadlock shows that no
// parked goroutine outlives these.
func TestUnitSerialQueueParks(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		ended := make(chan struct{})
		keep := true
		var starts atomic.Int32
		q := &serialQueue{retired: func() bool { return keep }, workQueue: workQueue[queuedJob]{
			budget: newBudget(1<<20, 1<<19), linger: time.Second, ended: func() <-chan struct{} { return ended }}}
		isParked := func() bool {
			q.mu.Lock()
			defer q.mu.Unlock()
			return q.parked
		}
		var gids []uint64
		job := func() {
			gids = append(gids, goid())
		}
		push := func() {
			if q.idle() && !isParked() {
				starts.Add(1)
			}
			q.push(1, job)
		}

		push()
		push()
		synctest.Wait()
		if !isParked() {
			t.Fatal("after a burst the goroutine did not park")
		}
		time.Sleep(900 * time.Millisecond)
		push() // within the linger: the parked goroutine takes it
		synctest.Wait()
		if n := starts.Load(); n != 1 {
			t.Errorf("%d goroutine starts for two bursts within the linger, want 1", n)
		}
		if gids[0] != gids[2] {
			t.Error("the second burst ran on another goroutine")
		}
		time.Sleep(1100 * time.Millisecond) // the linger passes
		synctest.Wait()
		if isParked() || !q.idle() {
			t.Error("the goroutine did not retire after the linger")
		}

		push() // starts another, which parks
		synctest.Wait()
		if n := starts.Load(); n != 2 || !isParked() {
			t.Errorf("after the linger a push started %d goroutines in all (want 2), parked %v", n, isParked())
		}
		close(ended)
		synctest.Wait()
		if isParked() {
			t.Error("a parked goroutine did not retire when ended closed")
		}

		ended = make(chan struct{})
		keep = false
		push() // retired says no: retires at once, without parking
		synctest.Wait()
		if isParked() {
			t.Error("parked although retired did not keep the queue")
		}
		keep = true
		push()
		synctest.Wait()
		q.unpark() // as an outbox's retirement does: looks again, and parks again
		synctest.Wait()
		if !isParked() || len(gids) != 6 {
			t.Errorf("after unpark: parked %v, %d jobs ran (want true, 6)", isParked(), len(gids))
		}
		q.unpark()
		push() // before the woken goroutine looked again: it is still the one
		synctest.Wait()
		if len(gids) != 7 || gids[6] != gids[5] {
			t.Error("a push right after unpark did not run on the woken goroutine")
		}
		close(ended)
	})
}

// goid returns the calling goroutine's id, read from its stack header.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	b = b[:bytes.IndexByte(b, ' ')]
	n, _ := strconv.ParseUint(string(b), 10, 64)
	return n
}
