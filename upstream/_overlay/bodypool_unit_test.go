// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import "testing"

// Unit tests of the body pool (bodypool.go): no broker, no socket.

// TestPooledMemoFollowsTheSet checks that a remembered answer is dropped as
// soon as the set changes: a consumer removed must not get pooled bodies.
func TestPooledMemoFollowsTheSet(t *testing.T) {
	var s pooledSet
	ch, other := &Channel{}, &Channel{}
	var memo pooledMemo
	if s.has(ch, "a", &memo) {
		t.Fatal("empty set: has a")
	}
	s.add(ch, "a")
	for i := 0; i < 2; i++ { // the second from the memo
		if !s.has(ch, "a", &memo) {
			t.Fatalf("added a: lookup %d has not", i+1)
		}
	}
	if s.has(ch, "b", &memo) || s.has(other, "a", &memo) {
		t.Fatal("another tag, or the same tag on another channel, answered from a's memo")
	}
	if !s.has(ch, "a", &memo) {
		t.Fatal("a again after other lookups: has not")
	}
	s.remove(ch, "a")
	if s.has(ch, "a", &memo) {
		t.Fatal("removed a: still has it (a stale memo)")
	}
	s.add(ch, "a")
	if !s.has(ch, "a", &memo) {
		t.Fatal("added a again: has not")
	}
}

// TestBodyPoolGivesBackTheClass checks that a recycled buffer comes back with
// its class's capacity, from any slice of it whose capacity is at least that.
func TestBodyPoolGivesBackTheClass(t *testing.T) {
	for _, n := range []uint64{1, 256, 257, 512, 4000, 1 << maxBodyClass} {
		b := pooledBody(n)
		if len(b) != 0 || uint64(cap(b)) < n || cap(b)&(cap(b)-1) != 0 {
			t.Fatalf("pooledBody(%d): len %d cap %d, want 0 and a power of two ≥ n", n, len(b), cap(b))
		}
		b = append(b, make([]byte, n)...)
		b[0] = 7
		recycleBody(b[:1], false)
		again := pooledBody(n) // maybe b's buffer (sync.Pool may drop it): the class's cap either way
		if len(again) != 0 || cap(again) != cap(b) {
			t.Fatalf("pooledBody(%d) after recycling: len %d cap %d, want 0 and %d", n, len(again), cap(again), cap(b))
		}
		recycleBody(again, false)
	}
	if b := pooledBody(1<<maxBodyClass + 1); b != nil {
		t.Fatalf("pooledBody above the classes: cap %d, want nil", cap(b))
	}
}
