// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

// Pooled bodies for ConsumeFunc consumers, and pooled *Delivery values for the fast path.
//
// Who owns a pooled body, and when it returns:
//  1. ConsumeFunc registers its consumer here (pooledConsumers.add) before basic.consume, in the
//     drainer and legacy modes only; upstream mode pools nothing.
//  2. The read turn's holder, assembling a fast basic.deliver for a registered consumer whose
//     body fits one frame and the largest class, takes a buffer (contentAsm.header, pooledBody).
//     From then the body belongs to the delivery: the assembly, then the queued job or the
//     consumer's inbox, each the only holder in turn.
//  3. ConsumeFunc's loop lends it to the handler for one call. When the handler returns (or
//     when the delivery is requeued or dropped instead of handled), directConsumer.deliver
//     puts it back (recycleBody). From then the next delivery may be read into it.
//  4. A delivery that never reaches its ConsumeFunc (dropped by Close, or after the consumer
//     ended) is not returned: the garbage collector takes its buffer. Nothing waits for a return.
//
// What breaks if a handler keeps the body past its return: the pool is the process's, so the
// next pooled delivery, on any channel of any connection, may be read into the same bytes. The
// kept slice then silently shows another message, and reading it races with the read turn's
// holder writing the next body. ConsumeFunc's doc states the rule, and
// ConsumeFuncOptions.PoisonRecycled makes a breach visible in tests: the body is filled with
// PoisonByte instead of pooled, so a kept body reads as poison, and the race detector reports a
// reader racing the fill.

package amqp091

import (
	"maps"
	"sync"
	"sync/atomic"
	"unsafe"
)

// pooledKey names one consumer of one channel.
type pooledKey struct {
	ch  *Channel
	tag string
}

// pooledSet is the set of ConsumeFunc consumers, whose bodies are pooled. The reader asks it per
// content header, so it is read lock-free: a change (a ConsumeFunc starting or ending, rare)
// copies the map under mu and stores the copy, and a snapshot, once stored, never changes.
type pooledSet struct {
	mu   sync.Mutex // serialises changes, so that none is lost between a load and a store
	snap atomic.Pointer[map[pooledKey]struct{}]
}

// pooledConsumers is the process's set: a consumer is keyed by its *Channel, unique across
// connections.
var pooledConsumers pooledSet

// add and remove register and unregister ch's consumer tag; ConsumeFunc calls both.
func (s *pooledSet) add(ch *Channel, tag string)    { s.update(pooledKey{ch, tag}, true) }
func (s *pooledSet) remove(ch *Channel, tag string) { s.update(pooledKey{ch, tag}, false) }

// update stores a new snapshot with k added or removed.
func (s *pooledSet) update(k pooledKey, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[pooledKey]struct{}{}
	if cur := s.snap.Load(); cur != nil {
		next = maps.Clone(*cur)
	}
	delete(next, k)
	if add {
		next[k] = struct{}{}
	}
	s.snap.Store(&next)
}

// pooledMemo is has's last answer for one assembly, kept while the set is the same snapshot: a
// channel's deliveries mostly go to one consumer, so most headers cost a load and a compare.
type pooledMemo struct {
	snap *map[pooledKey]struct{}
	key  pooledKey
	ok   bool
}

// has reports whether ch's consumer tag takes pooled bodies; memo spares the lookup per header.
func (s *pooledSet) has(ch *Channel, tag string, memo *pooledMemo) bool {
	k := pooledKey{ch, tag}
	cur := s.snap.Load() // nil until the first add
	if cur != nil && (memo.snap != cur || memo.key != k) {
		_, ok := (*cur)[k]
		*memo = pooledMemo{cur, k, ok}
	}
	return cur != nil && memo.ok
}

// Body size classes: powers of two, 256 B to 1 MiB; no pooling above. A body gets the smallest
// class that holds it, so at most half a buffer is wasted.
const (
	minBodyClass = 8
	maxBodyClass = 20
)

// bodyPools hold each class's spare buffers as their first byte's *byte: a pointer fits in an
// interface as it is, where a []byte put in a sync.Pool would be boxed, an allocation per Put.
var bodyPools [maxBodyClass - minBodyClass + 1]sync.Pool

// deliveries holds spare *Delivery values for newFastDelivery (fastread.go).
var deliveries = sync.Pool{New: func() any { return new(Delivery) }}

// recycleDelivery pools d, which a consumer loop copied out and nobody holds: queues hand over
// copies, and Observer.Delivered keeps nothing past its call. The body is not recycled here: a
// Consume chan's application owns it, and ConsumeFunc returns its own (recycleBody).
func recycleDelivery(d *Delivery) {
	*d = Delivery{}
	deliveries.Put(d)
}

// pooledBody returns an empty pooled buffer for n bytes, nil if n is too big.
func pooledBody(n uint64) []byte {
	for c := minBodyClass; c <= maxBodyClass; c++ {
		if n > 1<<c {
			continue
		}
		if p, _ := bodyPools[c-minBodyClass].Get().(*byte); p != nil {
			// recycleBody put it in class c only with a capacity of at least 1<<c.
			return unsafe.Slice(p, 1<<c)[:0]
		}
		return make([]byte, 0, 1<<c)
	}
	return nil
}

// recycleBody takes back a body a ConsumeFunc handler was lent, once the handler returned: it
// pools b, or with poison fills it with PoisonByte and drops it. Any body goes in, pooled or not
// (one too large for a pooled buffer grew by doubling): ConsumeFunc's rule covers every body.
func recycleBody(b []byte, poison bool) {
	if poison {
		b = b[:cap(b)]
		for i := range b {
			b[i] = PoisonByte
		}
		return
	}
	if cap(b) >= 2<<maxBodyClass {
		return // the 1 MiB class would waste over half of it: left to the GC
	}
	// The largest class b holds; a buffer smaller than the smallest class is dropped.
	for c := maxBodyClass; c >= minBodyClass; c-- {
		if cap(b) >= 1<<c {
			bodyPools[c-minBodyClass].Put(unsafe.SliceData(b[:1]))
			return
		}
	}
}
