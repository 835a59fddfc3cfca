// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"sync"
	"time"
)

// The Observer's (observe.go) publish, confirm, RPC and connection hooks,
// and the confirm clock. The others are called where their work is done:
// Delivered in inbox.go, Handled in consumefunc.go, Settled through
// iocount.go, SettleRefused in recoverytags.go, the budget's and
// ListenerDropped in watch.go. Every call starts with a nil check, so
// without an Observer the fast paths are what they were.

// confirmClock is when each unconfirmed publish of one channel was sent,
// for ConfirmInfo.Latency. The read path keeps one per channel id
// (confirmClocks) while its Observer has a Confirmed hook; the Channel
// holds no state of its own, so upstream's Channel is unchanged.
type confirmClock struct {
	obs *Observer

	mu   sync.Mutex
	base uint64  // delivery tag of sent[head]
	sent []int64 // monoNow when each tag from base was sent; 0 once confirmed
	head int
}

// confirmClocks holds a connection's confirm clocks by channel id. A
// channel id that is reused starts its tags at 1 again, which restarts its
// clock (sending).
type confirmClocks struct {
	mu sync.Mutex
	m  map[uint16]*confirmClock
}

// clock returns channel id's clock, made on first use, or nil when obs
// has no Confirmed hook.
func (s *confirmClocks) clock(obs *Observer, id uint16) *confirmClock {
	if obs == nil || obs.Confirmed == nil {
		return nil
	}
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

// clockOf is the confirm clock of channel ch, or nil when nobody asks for
// confirm latencies.
func (ch *Channel) clockOf() *confirmClock {
	c := ch.connection
	if c == nil || c.rp == nil {
		return nil
	}
	return c.rp.base().clockOf(ch.id)
}

// sending records that tag is about to be written. Tags grow by one per
// publish; a tag that does not follow the last one (the channel was
// reopened by recovery, whose tags start again at 1) starts afresh.
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

// confirmed reports the broker's ack or nack of tag (and of every earlier
// tag, if multiple), one Confirmed call per tag, in tag order.
func (o *confirmClock) confirmed(channel uint16, tag uint64, multiple, ack bool) {
	f := o.obs.Confirmed
	now := monoNow()
	o.mu.Lock()
	defer o.mu.Unlock()
	emit := func(i int) {
		if at := o.sent[i]; at != 0 {
			o.sent[i] = 0
			f(ConfirmInfo{Channel: channel, DeliveryTag: o.base + uint64(i-o.head), Ack: ack, Latency: time.Duration(now - at)})
		}
	}
	n := len(o.sent) - o.head
	if tag < o.base || tag >= o.base+uint64(n) {
		if !multiple {
			// Not sent through the fast path (or already confirmed):
			// still reported, without a latency.
			f(ConfirmInfo{Channel: channel, DeliveryTag: tag, Ack: ack})
			return
		}
		if tag < o.base {
			return
		}
		tag = o.base + uint64(n) - 1
	}
	last := o.head + int(tag-o.base)
	if multiple {
		for i := o.head; i <= last; i++ {
			emit(i)
		}
	} else {
		emit(last)
	}
	// Drop the confirmed prefix.
	for o.head < len(o.sent) && o.sent[o.head] == 0 {
		o.head++
		o.base++
	}
	if o.head == len(o.sent) {
		o.sent, o.head = o.sent[:0], 0
	}
}

// publishObserved is publishFast with the Observer's publish hooks. The
// message is copied for BeforePublish, so that it may replace the headers
// without touching the caller's Publishing.
func (ch *Channel) publishObserved(ctx context.Context, o *Observer, exchange, key string, mandatory, immediate bool, msg *Publishing) (*DeferredConfirmation, error) {
	info := PublishInfo{Channel: ch.id, Exchange: exchange, RoutingKey: key, Mandatory: mandatory, BodySize: len(msg.Body)}
	var clock *confirmClock
	if o.Confirmed != nil {
		clock = ch.clockOf()
	}
	var dc *DeferredConfirmation
	var err error
	if o.BeforePublish != nil {
		// A pooled copy: msg itself must flow nowhere but publishFrames,
		// or it escapes to the heap on every path.
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

// observeConfirm is the confirm hook of both read modes, as a basic.ack or
// basic.nack arrives.
func (ch *Channel) observeConfirm(tag uint64, multiple, ack bool) {
	if clock := ch.clockOf(); clock != nil {
		clock.confirmed(ch.id, tag, multiple, ack)
	}
}

// observeOpened reports a generation's completed handshake.
func observeOpened(obs *Observer, mode string, generation int32) {
	if obs == nil || obs.Connection == nil {
		return
	}
	kind := ConnectionOpened
	if generation > 1 {
		kind = ConnectionRecovered
	}
	obs.Connection(ConnectionEvent{Kind: kind, Mode: mode})
}

// observeEnd reports the end of a generation once, however many times
// upstream's shutdown runs for it.
func observeEnd(obs *Observer, mode string, g *genEnd, err *Error) {
	if obs == nil || obs.Connection == nil || !g.reported.CompareAndSwap(false, true) {
		return
	}
	if err == nil {
		obs.Connection(ConnectionEvent{Kind: ConnectionClosed, Mode: mode})
		return
	}
	obs.Connection(ConnectionEvent{Kind: ConnectionFailed, Mode: mode, Err: err})
}

// observedWait runs wait, a read mode's wait for the reply to a request on
// channel (res are the replies it expects), and reports it to obs's RPC
// hook, if there is one.
func observedWait(obs *Observer, channel uint16, res []message, wait func() error) error {
	if obs == nil || obs.RPC == nil {
		return wait()
	}
	start := time.Now()
	err := wait()
	obs.RPC(RPCInfo{Channel: channel, Method: requestFor(res), Latency: time.Since(start), Err: err})
	return err
}
