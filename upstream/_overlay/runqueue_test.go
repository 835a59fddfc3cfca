// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import "testing"

// TestRunQueueStartsOncePerBurst pins what the goroutine's life hangs on:
// only the first put of a burst asks for a goroutine, and front retires it
// when the queue is empty, so the next put asks again.
func TestRunQueueStartsOncePerBurst(t *testing.T) {
	var q runQueue[int]
	if !q.put(1) {
		t.Fatal("the first put of a burst must start the goroutine")
	}
	if q.put(2) {
		t.Fatal("a put while the goroutine runs must not start another")
	}
	for want := 1; want <= 2; want++ {
		v, ok := q.front()
		if !ok || v != want {
			t.Fatalf("front = %d, %v; want %d, true", v, ok, want)
		}
		q.drop()
	}
	if _, ok := q.front(); ok {
		t.Fatal("front of an empty queue must retire the goroutine")
	}
	if q.running {
		t.Fatal("a retired queue must not count as running")
	}
	if !q.put(3) {
		t.Fatal("the first put after retiring must start a goroutine again")
	}
}

// TestRunQueueFrontStays pins that front leaves the item in place until
// drop, which the outbox relies on: the item at the front is the one
// being handed over, and Stats and the warnings read it there.
func TestRunQueueFrontStays(t *testing.T) {
	var q runQueue[string]
	q.put("a")
	q.put("b")
	if v, _ := q.front(); v != "a" {
		t.Fatalf("front = %q, want a", v)
	}
	if v, _ := q.front(); v != "a" {
		t.Fatalf("a second front = %q, want a again", v)
	}
	if got := q.queued(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("queued = %q, want [a b]", got)
	}
	q.drop()
	if got := q.queued(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("queued after drop = %q, want [b]", got)
	}
}

// TestRunQueueSlidesInsteadOfGrowing pins that a queue which never empties
// (a producer always one item ahead) reuses its array: once half of it has
// been taken, put slides the waiting items down rather than growing, and
// clears the slots it leaves so they pin nothing.
func TestRunQueueSlidesInsteadOfGrowing(t *testing.T) {
	var q runQueue[*int]
	for i := 0; i < 8; i++ {
		v := i
		q.put(&v)
	}
	step := func(round int) {
		if _, ok := q.front(); !ok {
			t.Fatal("the queue emptied")
		}
		q.drop()
		v := round
		q.put(&v)
	}
	// The array full from the start grows once (nothing was taken yet
	// when it filled), then never again.
	for round := 0; round < 64; round++ {
		step(round)
	}
	capacity := cap(q.items)
	for round := 0; round < 10*capacity; round++ {
		step(round)
	}
	if cap(q.items) != capacity {
		t.Fatalf("cap grew from %d to %d with a constant backlog", capacity, cap(q.items))
	}
	for i, p := range q.items[:q.head] {
		if p != nil {
			t.Fatalf("slot %d before the head still pins an item", i)
		}
	}
	if n := len(q.queued()); n != 8 {
		t.Fatalf("%d items wait, want 8", n)
	}
}

// TestRunQueueKeepsSmallArrays pins the memory rule of a retiring queue:
// an array up to keepItems is kept for the next burst, a bigger one (left
// by a burst the budget allowed) is let go.
func TestRunQueueKeepsSmallArrays(t *testing.T) {
	drain := func(q *runQueue[int]) {
		for {
			if _, ok := q.front(); !ok {
				return
			}
			q.drop()
		}
	}
	var small runQueue[int]
	for i := 0; i < 10; i++ {
		small.put(i)
	}
	drain(&small)
	if cap(small.items) == 0 {
		t.Fatal("a small array was dropped at retirement")
	}
	var big runQueue[int]
	for i := 0; i < 2*keepItems; i++ {
		big.put(i)
	}
	drain(&big)
	if big.items != nil {
		t.Fatalf("an array of cap %d was kept at retirement", cap(big.items))
	}
}
