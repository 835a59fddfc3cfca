// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Pooled consumption: Channel.ConsumeFunc.
//
// A Consume chan hands the application a Delivery whose Body it owns for
// ever, so every message costs a fresh body. ConsumeFunc calls a handler
// instead, and takes the body back when the handler returns: in the
// drainer and legacy modes the fast path (fastread.go) reads each body of
// such a consumer straight into a buffer from a size-classed sync.Pool,
// and ConsumeFunc puts it back once the handler is done with it.

// ConsumeFuncOptions are the options of Channel.ConsumeFunc; the zero
// value consumes with manual acknowledgement and a generated consumer tag.
// The fields mean what the arguments of Channel.Consume of the same names
// mean.
type ConsumeFuncOptions struct {
	Consumer  string
	AutoAck   bool
	Exclusive bool
	NoLocal   bool
	NoWait    bool
	Args      Table

	// PoisonRecycled overwrites each body with PoisonByte as soon as the
	// handler returns, and then drops it instead of reusing it, so that a
	// program keeping Body (or a slice of it) past its handler always
	// reads the poison, deterministically, instead of, now and then,
	// another message's bytes; under the race detector, a goroutine still
	// reading it while it is overwritten is reported. For tests: it costs
	// a write over every body, and the pool's savings.
	PoisonRecycled bool
}

// PoisonByte is what ConsumeFuncOptions.PoisonRecycled fills recycled
// bodies with.
const PoisonByte = 0xDB

// ErrConsumerCancelled is returned by ConsumeFunc when the broker
// cancelled the consumer (the queue was deleted, say) while the channel
// stayed open.
var ErrConsumerCancelled = errors.New("amqp: consumer cancelled by the broker")

// ConsumeFunc consumes queue as Consume does, but calls handler for each
// delivery, one at a time, in order, on the calling goroutine, and blocks
// until the consumption ends.
//
// THE BODY IS ONLY VALID INSIDE THE HANDLER, AND SO IS d. In the drainer
// and legacy read modes, d.Body comes from a pool and is recycled for
// another message as soon as handler returns: a program that keeps d.Body,
// or any slice of it, after handler returned reads another message's
// bytes. d itself is reused for the next delivery. Copy what must outlive
// the handler: bytes.Clone(d.Body), and the Delivery by value (kept :=
// *d), whose other fields (strings, Headers, tags) stay valid, so that
// kept.Ack works later. Set
// ConsumeFuncOptions.PoisonRecycled in tests to catch a body kept too long.
// In upstream mode (no read path) the bodies are upstream's, allocated per
// message and never recycled; the rule stands all the same, so that code
// does not depend on the mode.
//
// Acknowledgement is the application's, as with Consume: without AutoAck,
// call d.Ack, d.Nack or d.Reject, inside the handler or later.
//
// ConsumeFunc returns:
//   - ctx.Err() once ctx ends: the consumer is cancelled (basic.cancel),
//     and the deliveries that arrived before the broker confirmed the
//     cancel are still handed to handler first, so none is lost;
//   - the handler's error, as soon as it returns one: the consumer is
//     cancelled, and deliveries already in flight are not handed to the
//     handler: without AutoAck they are rejected with requeue (Nack), with
//     AutoAck they are dropped, as the unread deliveries of a cancelled
//     Consume chan are;
//   - the channel's or the connection's close error (a *Error, or
//     ErrClosed) when either closes, and ErrConsumerCancelled when the
//     broker cancels the consumer.
//
// In the drainer and legacy modes there is no Consume chan in between:
// ConsumeFunc takes the deliveries straight from the consumer's queue,
// every delivery of a burst per wake-up (directconsume.go). In legacy
// mode it also reads the socket itself while it waits for a delivery and
// nobody else is reading, as rabbitmq-c's amqp_consume_message does, so a
// consumer needs no DrainEvents loop beside it; where one runs (or
// AutoDrain's), whoever reads hands the deliveries over. Nobody asked
// ConsumeFunc's own reads to block, so a write from another goroutine (a
// publish) cuts them short, as with AutoDrain, even in plain legacy mode,
// where a write still waits for a DrainEvents read in progress.
func (ch *Channel) ConsumeFunc(ctx context.Context, queue string, opts ConsumeFuncOptions, handler func(d *Delivery) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag := opts.Consumer
	if tag == "" {
		tag = uniqueConsumerTag()
	}
	closed := ch.NotifyClose(make(chan *Error, 1))
	defer ch.forgetClose(closed)
	c := ch.connection
	pooled := c != nil && c.rp != nil
	if pooled {
		// Before basic.consume: deliveries may follow consume-ok at once.
		pooledConsumers.add(ch, tag)
		defer pooledConsumers.remove(ch, tag)
	}
	var ready chan directHandoff
	if acct := ch.consumers.acct; acct != nil {
		// Served by this goroutine, without a chan (directconsume.go).
		ready = acct.expectDirect(tag)
	}
	deliveries, err := ch.Consume(queue, tag, opts.AutoAck, opts.Exclusive, opts.NoLocal, opts.NoWait, opts.Args)
	if err != nil {
		if ready != nil {
			ch.consumers.acct.withdrawDirect(tag, ready)
		}
		return err
	}
	recycle := func(d *Delivery) {
		if pooled {
			recycleBody(d.Body, opts.PoisonRecycled)
		}
		d.Body = nil
	}
	handle := handler
	if obs := ch.connection.obsOf(); obs != nil && obs.Handled != nil {
		handle = func(d *Delivery) error {
			start := time.Now()
			err := handler(d)
			obs.Handled(d, time.Since(start), err)
			return err
		}
	}
	if ready != nil {
		dc := &directConsumer{ch: ch, tag: tag, autoAck: opts.AutoAck, handle: handle, recycle: recycle}
		return ch.consumeDirect(ctx, <-ready, dc, closed)
	}
	// One Delivery for the whole consumption: handler gets a pointer to
	// it, which would otherwise cost an allocation per message.
	d := new(Delivery)
	for {
		select {
		case next, ok := <-deliveries:
			if !ok {
				return consumeEnded(closed)
			}
			*d = next
			herr := handle(d)
			recycle(d)
			if herr != nil {
				_ = ch.Cancel(tag, false)
				for d := range deliveries {
					if !opts.AutoAck {
						_ = d.Nack(false, true)
					}
					recycle(&d)
				}
				return herr
			}
		case <-ctx.Done():
			if err := ch.Cancel(tag, false); err != nil {
				// The channel is gone: so are its deliveries.
				for d := range deliveries {
					recycle(&d)
				}
				return ctx.Err()
			}
			// Deliveries that arrived before cancel-ok: handle them, so
			// none is lost, then stop.
			for next := range deliveries {
				*d = next
				_ = handle(d)
				recycle(d)
			}
			return ctx.Err()
		}
	}
}

// forgetClose unregisters a NotifyClose listener that ConsumeFunc
// registered, so that consumers started and ended one after another on a
// long-lived channel do not pile up listeners (and a send to each at the
// channel's close). Upstream has no way to unregister a listener; a
// channel that has closed has already dropped them all.
func (ch *Channel) forgetClose(c chan *Error) {
	ch.notifyM.Lock()
	defer ch.notifyM.Unlock()
	kept := make([]chan *Error, 0, len(ch.closes))
	for _, l := range ch.closes {
		if l != c {
			kept = append(kept, l)
		}
	}
	ch.closes = kept
}

// consumeEnded says why a consumer's deliveries ended: the channel's close
// error, if it closed, else the broker's cancel.
func consumeEnded(closed <-chan *Error) error {
	select {
	case e, ok := <-closed:
		if ok && e != nil {
			return e
		}
		return ErrClosed
	default:
		return ErrConsumerCancelled
	}
}

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
	// goes into an interface without allocating; a slice does not): Get
	// frees one, recycleBody takes one.
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
