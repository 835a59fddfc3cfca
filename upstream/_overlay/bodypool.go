// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

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

// pooledSet is the ConsumeFunc consumers (pooled bodies), read lock-free: a change replaces a snapshot.
type pooledSet struct {
	mu   sync.Mutex
	snap atomic.Pointer[map[pooledKey]struct{}]
}

var pooledConsumers pooledSet

func (s *pooledSet) add(ch *Channel, tag string)    { s.update(pooledKey{ch, tag}, true) }
func (s *pooledSet) remove(ch *Channel, tag string) { s.update(pooledKey{ch, tag}, false) }

func (s *pooledSet) update(k pooledKey, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[pooledKey]struct{}{}
	if cur := s.snap.Load(); cur != nil {
		next = maps.Clone(*cur)
	}
	if delete(next, k); add {
		next[k] = struct{}{}
	}
	s.snap.Store(&next)
}

// pooledMemo is has's last answer, kept while the set is the same snapshot.
type pooledMemo struct {
	snap *map[pooledKey]struct{}
	key  pooledKey
	ok   bool
}

// has reports whether ch's consumer tag takes pooled bodies; memo spares the lookup per header.
func (s *pooledSet) has(ch *Channel, tag string, memo *pooledMemo) bool {
	k, cur := pooledKey{ch, tag}, s.snap.Load() // nil until the first add
	if cur != nil && (memo.snap != cur || memo.key != k) {
		_, ok := (*cur)[k]
		*memo = pooledMemo{cur, k, ok}
	}
	return cur != nil && memo.ok
}

// Body size classes: powers of two, 256 B to 1 MiB; no pooling above.
const (
	minBodyClass = 8
	maxBodyClass = 20
)

// bodyPools hold each class's spare buffers as their first byte's *byte, which needs no allocation.
var bodyPools [maxBodyClass - minBodyClass + 1]sync.Pool

var deliveries = sync.Pool{New: func() any { return new(Delivery) }} // spare *Delivery, for newFastDelivery

// recycleDelivery pools d, which a consumer loop copied out and nobody holds: queues hand over
// copies, and Observer.Delivered keeps nothing past its call.
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
			return unsafe.Slice(p, 1<<c)[:0]
		}
		return make([]byte, 0, 1<<c)
	}
	return nil
}

// recycleBody pools b, or with poison fills it with PoisonByte and drops it.
func recycleBody(b []byte, poison bool) {
	if poison {
		b = b[:cap(b)]
		for i := range b {
			b[i] = PoisonByte
		}
		return
	}
	if cap(b) >= 2<<maxBodyClass {
		return // grown past the classes (a body longer than announced)
	}
	for c := maxBodyClass; c >= minBodyClass; c-- {
		if cap(b) >= 1<<c {
			bodyPools[c-minBodyClass].Put(unsafe.SliceData(b[:1])) // cap(b) ≥ 1<<c: the class's buffer
			return
		}
	}
}
