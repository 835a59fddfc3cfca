// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"sync"
	"time"
)

// The Observer's publish, confirm, RPC and connection hooks; the others are called where they happen.

// confirmClock is when each unconfirmed publish of a channel id (not Channel) was sent, for ConfirmInfo.Latency.
type confirmClock struct {
	obs  *Observer
	mu   sync.Mutex // guards base, sent and head
	base uint64     // delivery tag of sent[head]
	sent []int64    // monoNow when each tag from base was sent; 0 once confirmed
	head int
}

// confirmClocks holds the clocks by channel id; a reused id restarts at tag 1 (sending).
type confirmClocks struct {
	mu sync.Mutex
	m  map[uint16]*confirmClock
}

// clock returns id's clock, made on first use.
func (s *confirmClocks) clock(obs *Observer, id uint16) *confirmClock {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.m[id]
	if o == nil {
		if s.m == nil {
			s.m = map[uint16]*confirmClock{}
		}
		o = &confirmClock{obs: obs}
		s.m[id] = o
	}
	return o
}

// obsOf is the Observer of c's read path, or nil.
func (c *Connection) obsOf() *Observer {
	if c == nil || c.rp == nil {
		return nil
	}
	return c.rp.base().obs
}

// clockOf is ch's confirm clock, or nil when nobody asks for latencies (no Confirmed hook).
func (ch *Channel) clockOf() *confirmClock {
	if o := ch.connection.obsOf(); o != nil && o.Confirmed != nil {
		return ch.connection.rp.base().clocks.clock(o, ch.id)
	}
	return nil
}

// sending records that tag is about to be written; one not following the last (recovery restarts at 1) starts afresh.
func (o *confirmClock) sending(tag uint64) {
	now := monoNow()
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.sent) - o.head; n == 0 || tag != o.base+uint64(n) {
		o.sent, o.head, o.base = o.sent[:0], 0, tag
	}
	if len(o.sent) == cap(o.sent) && o.head >= len(o.sent)/2 {
		// Slide down rather than grow: confirms keep up, mostly.
		n := copy(o.sent, o.sent[o.head:])
		o.sent, o.head = o.sent[:n], 0
	}
	o.sent = append(o.sent, now)
}

// unsent forgets tag, the last one recorded, whose write failed.
func (o *confirmClock) unsent(tag uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.sent) - o.head; n > 0 && tag == o.base+uint64(n-1) {
		o.sent = o.sent[:len(o.sent)-1]
	}
}

// confirmed reports the ack or nack of tag (and earlier ones if multiple), one Confirmed call per tag, in order.
func (o *confirmClock) confirmed(channel uint16, tag uint64, multiple, ack bool) {
	f := o.obs.Confirmed
	now := monoNow()
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.sent) - o.head
	if tag < o.base || tag >= o.base+uint64(n) {
		if !multiple {
			// Not timed (or already confirmed): reported without latency.
			f(ConfirmInfo{Channel: channel, DeliveryTag: tag, Ack: ack})
			return
		}
		if tag < o.base {
			return
		}
		tag = o.base + uint64(n) - 1
	}
	first, last := o.head, o.head+int(tag-o.base)
	if !multiple {
		first = last
	}
	for i := first; i <= last; i++ {
		if at := o.sent[i]; at != 0 {
			o.sent[i] = 0
			f(ConfirmInfo{Channel: channel, DeliveryTag: o.base + uint64(i-o.head), Ack: ack, Latency: time.Duration(now - at)})
		}
	}
	for o.head < len(o.sent) && o.sent[o.head] == 0 { // drop the confirmed prefix
		o.head, o.base = o.head+1, o.base+1
	}
	if o.head == len(o.sent) {
		o.sent, o.head = o.sent[:0], 0
	}
}

// publishObserved is publishFast with the publish hooks; BeforePublish gets a copy of msg.
func (ch *Channel) publishObserved(ctx context.Context, o *Observer, exchange, key string, mandatory, immediate bool, msg *Publishing) (dc *DeferredConfirmation, err error) {
	info := PublishInfo{Channel: ch.id, Exchange: exchange, RoutingKey: key, Mandatory: mandatory, BodySize: len(msg.Body)}
	clock := ch.clockOf()
	if o.BeforePublish != nil {
		// Pooled: msg must flow only to publishFrames or it escapes.
		cp := publishingPool.Get().(*Publishing)
		*cp = *msg
		ctx = o.BeforePublish(ctx, info, cp)
		dc, err = ch.publishFrames(exchange, key, mandatory, immediate, cp, clock)
		*cp = Publishing{}
		publishingPool.Put(cp)
	} else {
		dc, err = ch.publishFrames(exchange, key, mandatory, immediate, msg, clock)
	}
	if o.Published != nil {
		if dc != nil {
			info.DeliveryTag = dc.DeliveryTag
		}
		o.Published(ctx, info, err)
	}
	return dc, err
}

// publishingPool holds the copies that BeforePublish may change.
var publishingPool = sync.Pool{New: func() any { return new(Publishing) }}

// observeConfirm is both read modes' hook for an arriving basic.ack or nack.
func (ch *Channel) observeConfirm(tag uint64, multiple, ack bool) {
	if clock := ch.clockOf(); clock != nil {
		clock.confirmed(ch.id, tag, multiple, ack)
	}
}

// observeEnd reports a generation's end once, however often shutdown runs.
func observeEnd(obs *Observer, mode string, g *genEnd, err *Error) {
	if obs == nil || obs.Connection == nil || !g.reported.CompareAndSwap(false, true) {
		return
	}
	ev := ConnectionEvent{Kind: ConnectionClosed, Mode: mode}
	if err != nil { // not ev.Err = err unconditionally: a nil *Error is a non-nil error
		ev.Kind, ev.Err = ConnectionFailed, err
	}
	obs.Connection(ev)
}

// observedWait runs wait, for a reply (one of res) on channel, and reports it to obs.RPC.
func observedWait(obs *Observer, channel uint16, res []message, wait func() error) error {
	if obs == nil || obs.RPC == nil {
		return wait()
	}
	start := time.Now()
	err := wait()
	obs.RPC(RPCInfo{Channel: channel, Method: requestFor(res), Latency: time.Since(start), Err: err})
	return err
}
