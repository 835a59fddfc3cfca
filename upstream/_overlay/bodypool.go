// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"sync"
	"sync/atomic"
)

// The body pool of ConsumeFunc (consumefunc.go): in the drainer and legacy
// modes the fast path (fastread.go) reads each body of a ConsumeFunc
// consumer straight into a buffer from a size-classed sync.Pool, and
// ConsumeFunc puts it back once the handler is done with it.

// pooledKey names one consumer of one channel.
type pooledKey struct {
	ch  *Channel
	tag string
}

// pooledSet is the set of ConsumeFunc consumers, whose bodies come from the
// pool. The fast path looks it up once per message, lock-free: it reads a
// snapshot that add and remove replace.
type pooledSet struct {
	mu   sync.Mutex
	snap atomic.Pointer[map[pooledKey]struct{}]
}

var pooledConsumers pooledSet

func (s *pooledSet) update(f func(map[pooledKey]struct{})) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[pooledKey]struct{}{}
	if cur := s.snap.Load(); cur != nil {
		for k := range *cur {
			next[k] = struct{}{}
		}
	}
	f(next)
	if len(next) == 0 {
		s.snap.Store(nil)
		return
	}
	s.snap.Store(&next)
}

func (s *pooledSet) add(ch *Channel, tag string) {
	s.update(func(m map[pooledKey]struct{}) { m[pooledKey{ch, tag}] = struct{}{} })
}

func (s *pooledSet) remove(ch *Channel, tag string) {
	s.update(func(m map[pooledKey]struct{}) { delete(m, pooledKey{ch, tag}) })
}

// has reports whether ch's consumer tag takes pooled bodies.
func (s *pooledSet) has(ch *Channel, tag string) bool {
	cur := s.snap.Load()
	if cur == nil {
		return false
	}
	_, ok := (*cur)[pooledKey{ch, tag}]
	return ok
}

// Body size classes: powers of two from 1<<minBodyClass to 1<<maxBodyClass.
// Larger bodies are allocated and left to the garbage collector.
const (
	minBodyClass = 8  // 256 B
	maxBodyClass = 20 // 1 MiB
)

var (
	bodyPools [maxBodyClass - minBodyClass + 1]sync.Pool
	// holders carries the *[]byte that the class pools store (a pointer
	// goes into an interface without allocating; a slice does not):
	// pooledBody frees one, recycleBody takes one.
	holders sync.Pool
)

// bodyClassFor returns the class whose buffers hold n bytes, or -1.
func bodyClassFor(n uint64) int {
	for c := minBodyClass; c <= maxBodyClass; c++ {
		if n <= 1<<c {
			return c - minBodyClass
		}
	}
	return -1
}

// pooledBody returns an empty buffer with room for n bytes from the pool,
// or nil when n is beyond the largest class.
func pooledBody(n uint64) []byte {
	class := bodyClassFor(n)
	if class < 0 {
		return nil
	}
	if h, _ := bodyPools[class].Get().(*[]byte); h != nil {
		b := *h
		*h = nil
		holders.Put(h)
		return b[:0]
	}
	return make([]byte, 0, 1<<(class+minBodyClass))
}

// recycleBody returns b to the pool of the largest class it can serve, or,
// when poison is set, overwrites it with PoisonByte and drops it: a body
// kept too long must read as poison every time, which reuse would undo.
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
	class := -1
	for c := maxBodyClass; c >= minBodyClass; c-- {
		if cap(b) >= 1<<c {
			class = c - minBodyClass
			break
		}
	}
	if class < 0 {
		return
	}
	h, _ := holders.Get().(*[]byte)
	if h == nil {
		h = new([]byte)
	}
	*h = b[:0]
	bodyPools[class].Put(h)
}
