// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Stats is a snapshot of what a connection has moved and what it holds,
// from (*Connection).Stats. Counters cover the connection's whole life,
// every recovery generation included.
type Stats struct {
	Mode string    // the read mode, as ReadMode reports it
	At   time.Time // when the snapshot was taken

	// Bytes and frames read from and written to the socket. In upstream
	// mode only FramesIn is counted (upstream's reader counts the frames
	// it dispatches); the others stay 0.
	BytesIn, BytesOut   uint64
	FramesIn, FramesOut uint64
	// Writes counts the writes (write or writev system calls) of the
	// socket writer in the drainer and legacy modes: legacy's heartbeats
	// go through it, the drainer's do not. CoalescedPublishes counts the
	// publishes written by another publisher (CoalescePublishes: one that
	// arrives during a write joins the next batch, which the batch's first
	// publisher writes). Upstream mode counts neither.
	Writes             uint64
	CoalescedPublishes uint64

	// Budget is the drainer's memory budget. In legacy mode Limit is 0
	// (legacy never stops reading for memory: the caller reads) and Used
	// counts the deliveries waiting in consumer buffers.
	Budget BudgetStats

	// Listeners lists, in drainer mode, the notifications waiting for a
	// listener (NotifyPublish, NotifyReturn, ...): one entry per channel
	// and kind with anything queued, biggest first. Legacy and upstream
	// hand notifications over inline, so nothing waits there.
	Listeners []ListenerStats

	// Consumers lists, in drainer and legacy modes, the deliveries that
	// wait for the application (its Consume chan, or ConsumeFunc's
	// handler): one entry per consumer with anything queued, biggest first.
	Consumers []ConsumerStats

	// DroppedListeners counts the listeners closed by the stall policy
	// (DrainerOptions.DropStalledListener).
	DroppedListeners uint64

	// StaleSettlements counts the Acks, Nacks and Rejects refused with
	// ErrStaleDelivery, and UnknownTagSettlements those refused with
	// ErrUnknownDeliveryTag (recoverytags.go); nothing was sent for either.
	// They count in every mode that keeps tags unique: the read paths, and
	// upstream mode with Config.SafeRecovery.
	StaleSettlements      uint64
	UnknownTagSettlements uint64
}

// BudgetStats is the budget part of Stats.
type BudgetStats struct {
	Limit int64 // the budget in bytes; 0 when the read path keeps none
	Used  int64 // bytes read that wait for a user

	Paused      bool          // reading is paused for the budget now
	Pauses      uint64        // how often reading paused
	PausedTotal time.Duration // how long reading paused in all, the current pause included
}

// ListenerKind names the kind of a listener, as the method that registers
// it: "NotifyPublish", "NotifyReturn", "NotifyFlow", "NotifyCancel",
// "NotifyBlocked"; "DeferredConfirmation" for settlements waiting behind a
// listener; "Consume" for a consumer, where a consumer and the listeners
// are ranked together (BudgetInfo.Holder, the warnings).
type ListenerKind string

// The kinds of listeners.
const (
	KindNotifyPublish        ListenerKind = "NotifyPublish"
	KindNotifyReturn         ListenerKind = "NotifyReturn"
	KindNotifyFlow           ListenerKind = "NotifyFlow"
	KindNotifyCancel         ListenerKind = "NotifyCancel"
	KindNotifyBlocked        ListenerKind = "NotifyBlocked"
	KindDeferredConfirmation ListenerKind = "DeferredConfirmation"
	KindConsumer             ListenerKind = "Consume"
)

// ListenerStats describes what waits for the listeners of one kind on one
// channel (0: the connection).
type ListenerStats struct {
	Kind        ListenerKind
	Channel     uint16
	Queued      int           // notifications waiting
	QueuedBytes int64         // what they are charged to the budget
	OldestAge   time.Duration // how long the oldest has waited
}

// ConsumerStats describes what waits for one consumer.
type ConsumerStats struct {
	Channel     uint16
	ConsumerTag string
	Queued      int           // deliveries waiting in its buffer
	QueuedBytes int64         // what they are charged to the budget
	OldestAge   time.Duration // how long the oldest has waited
}

// Stats returns a snapshot of the connection's counters and of what it
// holds for users. It is safe to call from any goroutine at any time,
// before and after Close; its cost grows with the number of channels and
// consumers, not with the traffic.
func (c *Connection) Stats() Stats {
	now := time.Now()
	s := Stats{Mode: c.ReadMode(), At: now}
	s.StaleSettlements = c.recovery.stale.Load()
	s.UnknownTagSettlements = c.recovery.unknown.Load()
	if c.rp == nil {
		s.FramesIn = c.dispatched.frames.Load()
		return s
	}
	c.rp.stats(&s, now)
	sort.SliceStable(s.Listeners, func(i, j int) bool {
		return s.Listeners[i].QueuedBytes > s.Listeners[j].QueuedBytes
	})
	sort.SliceStable(s.Consumers, func(i, j int) bool {
		return s.Consumers[i].QueuedBytes > s.Consumers[j].QueuedBytes
	})
	return s
}

// stats is Stats in legacy mode: the counters and the consumer buffers;
// notifications are handed over inline, as upstream does, so none wait.
func (l *legacyConn) stats(s *Stats, now time.Time) {
	l.io.fill(s)
	s.Budget = l.deliveries.snapshot(now)
	s.Budget.Limit = 0
	s.Consumers = l.buffers.fill(s.Consumers, monoNow())
}

// stats is Stats in drainer mode.
func (d *drainConn) stats(s *Stats, now time.Time) {
	d.io.fill(s)
	s.Budget = d.budget.snapshot(now)
	mono := monoNow()
	s.Listeners = d.connOut.listenerStats(s.Listeners, mono)
	d.mu.Lock()
	for _, disp := range d.dispatchers {
		s.Listeners = disp.out.listenerStats(s.Listeners, mono)
	}
	d.mu.Unlock()
	s.Consumers = d.buffers.fill(s.Consumers, mono)
	if d.watch != nil {
		s.DroppedListeners = d.watch.dropped.Load()
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
