// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"slices"
	"sync"
	"time"
)

// The Observer's publish, confirm, RPC and connection hooks; the others are called where
// they happen. Where each hook is called, and so on which goroutine it runs:
//   - BeforePublish, Published: publishObserved here and PublishBatch (publish.go), on the
//     publishing goroutine;
//   - Confirmed: observeConfirm here, and Returned: readgen.go's routeFrames, both on the
//     reading side as the frame is routed;
//   - Delivered: inbox.go, as a delivery is queued for its consumer;
//   - Handled: consumefunc.go, on the ConsumeFunc's goroutine;
//   - Settled: iocount.go's frameTally, inside the socket write;
//   - SettleRefused: recoverytags.go's settleTag, on the settling goroutine;
//   - RPC: observedWait here, around readgen.go's chanCall and connCall;
//   - BudgetPaused, BudgetResumed, ListenerDropped: watch.go, in drainer mode;
//   - Connection: readconn.go as a generation opens, observeEnd here at its end.

// confirmClock is when each unconfirmed publish of a channel id (not Channel) was sent, for
// ConfirmInfo.Latency. Tags are consecutive, so the send times live in one slice indexed from
// base: sent[head] is tag base's, sent[head+i] tag base+i's. A confirmed entry is zeroed,
// and the confirmed prefix is dropped as the broker confirms in order; the slice slides down
// rather than grow while confirms keep up, so a steady stream allocates nothing. mu is taken
// by the publishing side (sending, unsent) and the reading side (confirmed).
type confirmClock struct {
	obs  *Observer
	mu   sync.Mutex // guards base, sent and head
	base uint64     // delivery tag of sent[head]
	sent []int64    // monoNow when each tag from base was sent; 0 once confirmed
	head int
}

// confirmClocks holds the clocks by channel id, as the confirms arrive by id; a reused id
// restarts at tag 1, which sending sees and starts afresh.
type confirmClocks struct {
	mu sync.Mutex
	m  map[uint16]*confirmClock
}

// clock returns id's clock, made on first use, under s.mu: publishers on several channels
// and the reading side (confirms) may ask at once.
func (s *confirmClocks) clock(obs *Observer, id uint16) *confirmClock {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.m[id]
	if o == nil {
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

// clockOf is ch's confirm clock, or nil when nobody asks for latencies (no Confirmed hook):
// then publishes note no send times, and cost nothing more.
func (ch *Channel) clockOf() *confirmClock {
	if o := ch.connection.obsOf(); o != nil && o.Confirmed != nil {
		return ch.connection.rp.base().clocks.clock(o, ch.id)
	}
	return nil
}

// sending records that tag is about to be written; ch.m is held, so tags come in order. A
// tag not following the last (a recovery or a reused id restarts at 1) starts afresh.
func (o *confirmClock) sending(tag uint64) {
	now := monoNow()
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.sent) - o.head
	if n == 0 || tag != o.base+uint64(n) {
		o.sent = o.sent[:0]
		o.head = 0
		o.base = tag
	}
	if len(o.sent) == cap(o.sent) && o.head >= len(o.sent)/2 {
		// Slide down rather than grow: confirms keep up, mostly.
		o.sent = slices.Delete(o.sent, 0, o.head)
		o.head = 0
	}
	o.sent = append(o.sent, now)
}

// unsent forgets tag, the last one recorded, whose write failed: its tag is handed out again
// (publishFrames' unpublish), and will be recorded again.
func (o *confirmClock) unsent(tag uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.sent) - o.head
	if n > 0 && tag == o.base+uint64(n-1) {
		o.sent = o.sent[:len(o.sent)-1]
	}
}

// confirmed reports the ack or nack of tag (and earlier ones if multiple), one Confirmed call
// per tag, in order (the calls run under o.mu). A multiple confirm reports only the timed
// tags: those sent before the clock started afresh are not known any more.
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
			return // every tag it covers is confirmed already, or was never timed
		}
		tag = o.base + uint64(n) - 1 // covers the whole window: report up to its end
	}
	// The tags to report, as indexes into sent: one, or from the oldest waiting up to tag.
	first, last := o.head, o.head+int(tag-o.base)
	if !multiple {
		first = last
	}
	for i := first; i <= last; i++ {
		if at := o.sent[i]; at != 0 {
			o.sent[i] = 0
			f(ConfirmInfo{Channel: channel, DeliveryTag: o.base + uint64(i-o.head), Ack: ack,
				Latency: time.Duration(now - at)})
		}
	}
	// Drop the confirmed prefix; once all is confirmed, the next sending starts afresh.
	for o.head < len(o.sent) && o.sent[o.head] == 0 {
		o.head++
		o.base++
	}
}

// publishObserved is publishFrames with the publish hooks; BeforePublish gets a copy of msg, so
// that a hook adding trace headers never changes the application's Publishing.
func (ch *Channel) publishObserved(ctx context.Context, o *Observer, exchange, key string,
	mandatory, immediate bool, msg *Publishing) (dc *DeferredConfirmation, err error) {
	info := PublishInfo{Channel: ch.id, Exchange: exchange, RoutingKey: key,
		Mandatory: mandatory, BodySize: len(msg.Body)}
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

// observeEnd reports a generation's end once, however often shutdown runs: the genEnd's
// reported flag, set by compare-and-swap, picks the one call that reports.
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

// observedWait runs wait, for a reply (one of res) on channel, and reports it to obs.RPC,
// timed from the start of the wait: the request was written just before.
func observedWait(obs *Observer, channel uint16, res []message, wait func() error) error {
	if obs == nil || obs.RPC == nil {
		return wait()
	}
	start := time.Now()
	err := wait()
	obs.RPC(RPCInfo{Channel: channel, Method: requestFor(res), Latency: time.Since(start), Err: err})
	return err
}
