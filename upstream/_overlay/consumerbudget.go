// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"sync"
	"sync/atomic"
	"time"
)

// Deliveries wait in a per-consumer buffer until the application receives
// them from its Consume chan, or ConsumeFunc hands them to its handler.
// Upstream's buffer has no bound. A read path (both keep a budget; legacy
// mode's never pauses its reads) counts each delivery it queues in a
// consumer's inbox (inbox.go) against its budget from the moment it is
// dispatched until the consumer loop (consumeloop.go) hands it over or
// drops it, so that a consumer that stops reading makes the drainer stop
// reading the socket instead of growing the heap. Each buffer also keeps
// its depth, bytes and the age of its oldest delivery where Stats can
// read them.

// deliveryAcct is a channel's tie to its read path's accounting.
type deliveryAcct struct {
	budget  *budget
	buffers *bufferSet
	channel uint16
	obs     *Observer
	closing <-chan struct{} // closed when Close begins (consumeloop.go)
	inboxes inboxes         // each consumer's queue of deliveries (inbox.go)
}

// makeConsumers builds a channel's consumer registry, tied to the read
// path's budget when it keeps one.
func (c *Connection) makeConsumers(id uint16) *consumers {
	subs := makeConsumers()
	if c != nil && c.rp != nil {
		if rb := c.rp.base(); rb.deliveries != nil {
			subs.acct = &deliveryAcct{budget: rb.deliveries, buffers: &rb.buffers, channel: id, obs: rb.obs, closing: rb.calledC}
		}
	}
	return subs
}

// deliveryCost is what a buffered delivery is charged.
func deliveryCost(d *Delivery) int64 { return frameCost + int64(len(d.Body)) }

// deliver hands a delivery to the application if it waits for one, else
// to its consumer's inbox, charged to the budget until the application
// receives it. It never waits for the application.
func (subs *consumers) deliver(tag string, d *Delivery) {
	acct := subs.acct
	if acct.obs != nil && acct.obs.Delivered != nil {
		acct.obs.Delivered(d)
	}
	if isClosing(acct.closing) {
		return // Close has begun: dropped (consumeloop.go)
	}
	subs.Lock()
	defer subs.Unlock()
	in, found := subs.chans[tag]
	if !found {
		// No such consumer (cancelled with deliveries in flight): dropped,
		// as upstream drops it.
		return
	}
	box := acct.inboxOf(in, tag)
	if box.put(d, deliveryCost(d), acct.budget) {
		if w := acct.buffers.watch; w != nil {
			w.consumerQueued(box.st)
		}
	}
}

// bufferSet holds the consumer buffers of one connection, for Stats.
type bufferSet struct {
	watch *watcher // set before any consumer starts; nil without warnings

	mu  sync.Mutex
	all map[*bufferStat]struct{}
}

// bufferStat is what one consumer's inbox holds. The inbox writes it;
// Stats reads it.
type bufferStat struct {
	channel uint16
	tag     string
	queued  atomic.Int64
	bytes   atomic.Int64
	oldest  atomic.Int64 // monoNow of the oldest waiting delivery, 0 when empty
}

func (s *bufferSet) add(channel uint16, tag string) *bufferStat {
	st := &bufferStat{channel: channel, tag: tag}
	s.mu.Lock()
	if s.all == nil {
		s.all = map[*bufferStat]struct{}{}
	}
	s.all[st] = struct{}{}
	s.mu.Unlock()
	return st
}

func (s *bufferSet) remove(st *bufferStat) {
	s.mu.Lock()
	delete(s.all, st)
	s.mu.Unlock()
}

func (st *bufferStat) pushed(cost, oldest int64) {
	st.queued.Add(1)
	st.bytes.Add(cost)
	st.oldest.Store(oldest)
}

func (st *bufferStat) popped(cost, oldest int64) {
	st.queued.Add(-1)
	st.bytes.Add(-cost)
	st.oldest.Store(oldest)
}

// fill appends an entry for every buffer that holds deliveries.
func (s *bufferSet) fill(out []ConsumerStats, now int64) []ConsumerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	for st := range s.all {
		n := st.queued.Load()
		if n <= 0 {
			continue
		}
		cs := ConsumerStats{Channel: st.channel, ConsumerTag: st.tag, Queued: int(n), QueuedBytes: st.bytes.Load()}
		if at := st.oldest.Load(); at != 0 && now > at {
			cs.OldestAge = time.Duration(now - at)
		}
		out = append(out, cs)
	}
	return out
}

// cleared records that the inbox holds nothing.
func (st *bufferStat) cleared() {
	st.queued.Store(0)
	st.bytes.Store(0)
	st.oldest.Store(0)
}
