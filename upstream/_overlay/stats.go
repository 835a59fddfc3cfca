// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Stats is a snapshot from (*Connection).Stats; counters cover the connection's whole life.
type Stats struct {
	Mode string    // the read mode, as ReadMode reports it
	At   time.Time // when the snapshot was taken
	// Bytes and frames read and written; upstream mode counts only FramesIn.
	BytesIn, BytesOut, FramesIn, FramesOut uint64
	// Writes counts the socket writer's write(v) calls (legacy's heartbeats too, not the
	// drainer's), CoalescedPublishes the publishes written in another publisher's write
	// (CoalescePublishes); neither is counted in upstream mode.
	Writes, CoalescedPublishes uint64
	// Budget is the drainer's delivery budget; in legacy mode Limit is 0 and Used counts the
	// deliveries waiting in consumer buffers.
	Budget BudgetStats
	// Listeners (drainer mode) and Consumers (drainer, legacy) list what waits for
	// a listener or the application, per channel and kind or consumer, biggest first.
	Listeners        []ListenerStats
	Consumers        []ConsumerStats
	DroppedListeners uint64 // closed by the stall policy (DrainerOptions.DropStalledListener)
	// StaleSettlements and UnknownTagSettlements count the Acks, Nacks and Rejects refused
	// unsent with ErrStaleDelivery or ErrUnknownDeliveryTag (read modes, SafeRecovery).
	StaleSettlements, UnknownTagSettlements uint64
	// Credentials is the refresh of expiring credentials (ExpiringAuth), in every mode:
	// Expires always, the counters where the connection refreshes (upstream: SafeRecovery).
	Credentials CredentialStats
}

// CredentialStats is the credentials part of Stats (refresh.go).
type CredentialStats struct {
	// Refreshes counts the new secrets installed with update-secret, Failures the refreshes
	// that failed: the provider's answer, or update-secret.
	Refreshes, Failures uint64
	Expires             time.Time // when the login's or the last refresh's secret expires; zero: none

}

// BudgetStats is the budget part of Stats: the bytes read that wait for a listener or
// consumer, which the drainer stops reading above (budget.go).
type BudgetStats struct {
	Limit       int64         // the budget in bytes; 0 when the read path keeps none
	Used        int64         // bytes read that wait for a user
	Paused      bool          // reading is paused for the budget now
	Pauses      uint64        // how often reading paused
	PausedTotal time.Duration // how long reading paused in all, the current pause included
}

// ListenerKind names a listener's kind after the method registering it, "DeferredConfirmation"
// (settlements behind a listener) or "Consume" (a consumer, in BudgetInfo.Holder and warnings).
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

// ListenerStats is what waits for one kind of listener on a channel (0: the connection).
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

// Stats returns a snapshot of the counters and of what the connection holds for
// users, from any goroutine, also after Close; it costs per channel and consumer.
// The counters are read one by one without a common lock: each is exact, but two of them
// may be a moment apart.
func (c *Connection) Stats() Stats {
	now := time.Now()
	s := Stats{Mode: c.ReadMode(), At: now, StaleSettlements: c.recovery.stale.Load(),
		UnknownTagSettlements: c.recovery.unknown.Load(), Credentials: c.refresh.stats()}
	// Upstream mode has no socket writer of ours: only the frames its reader signals
	// (hook 9 of patch 0001) and the refused settlements are known.
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

// stats is Stats in legacy mode: no listener queues (notifications are handed over inline,
// by the reading goroutine), and no budget limit, only the deliveries consumers hold.
func (l *legacyConn) stats(s *Stats, now time.Time) {
	l.io.fill(s)
	s.Budget = l.deliveries.snapshot(now)
	s.Budget.Limit = 0 // legacy reads only when asked: it counts, but never pauses
	s.Consumers = l.buffers.fill(s.Consumers, monoNow())
}

// stats is Stats in drainer mode: the connection's outbox and each dispatcher's, the latter
// under d.mu, which guards the dispatcher map (a channel may open or close meanwhile).
func (d *drainConn) stats(s *Stats, now time.Time) {
	d.io.fill(s)
	s.Budget = d.budget.snapshot(now)
	mono := monoNow() // ages are measured on the monotonic clock the queues stamp
	s.Listeners = d.connOut.listenerStats(s.Listeners, mono)
	d.mu.Lock()
	for _, disp := range d.dispatchers {
		s.Listeners = disp.out.listenerStats(s.Listeners, mono)
	}
	d.mu.Unlock()
	s.Consumers = d.buffers.fill(s.Consumers, mono)
	if d.watch != nil { // only with warnings or the stall policy (watch.go)
		s.DroppedListeners = d.watch.dropped.Load()
	}
}

// bufferSet holds the consumer buffers of one connection, for Stats. all is a sync.Map, safe
// for concurrent use: a consumer's buffer is added as it starts and removed as it ends, while
// Stats reads.
type bufferSet struct {
	watch *watcher // set before any consumer starts; nil without warnings
	all   sync.Map // of *bufferStat keys
}

// bufferStat is what one consumer's inbox holds: the inbox writes it under its own lock,
// Stats reads it without that lock, so the fields are atomics and a snapshot's count, bytes
// and age may be a moment apart.
type bufferStat struct {
	channel       uint16
	tag           string
	queued, bytes atomic.Int64
	oldest        atomic.Int64 // monoNow of the oldest waiting delivery, 0 when empty
}

// add registers the buffer of the consumer tag on channel, as its inbox is made.
func (s *bufferSet) add(channel uint16, tag string) *bufferStat {
	st := &bufferStat{channel: channel, tag: tag}
	s.all.Store(st, nil)
	return st
}

// remove forgets a buffer whose consumer ended.
func (s *bufferSet) remove(st *bufferStat) { s.all.Delete(st) }

// moved counts n deliveries more (n < 0: taken) and their cost; oldest is the oldest
// waiting delivery's arrival (monoNow), 0 when none waits. The inbox calls it under its own
// lock, so one buffer's moves are stored in order.
func (st *bufferStat) moved(n, cost, oldest int64) {
	st.queued.Add(n)
	st.bytes.Add(cost)
	st.oldest.Store(oldest)
}

// fill appends an entry for every buffer that holds deliveries: an idle consumer is not
// listed, so the snapshot's size follows what is waiting, not how many consumers there are.
func (s *bufferSet) fill(out []ConsumerStats, now int64) []ConsumerStats {
	s.all.Range(func(st, _ any) bool {
		if cs := st.(*bufferStat).stats(now); cs.Queued > 0 {
			out = append(out, cs)
		}
		return true
	})
	return out
}

// stats is what st holds at now (monoNow); OldestAge is 0 when no delivery waits.
func (st *bufferStat) stats(now int64) ConsumerStats {
	cs := ConsumerStats{Channel: st.channel, ConsumerTag: st.tag, Queued: int(st.queued.Load()),
		QueuedBytes: st.bytes.Load()}
	if at := st.oldest.Load(); at != 0 && now > at {
		cs.OldestAge = time.Duration(now - at)
	}
	return cs
}
