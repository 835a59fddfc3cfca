// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Warnings before a stalled listener stalls the connection, and the stall
// policy.
//
// An unread listener holds back its channel's later notifications
// (outbox.go), and what waits is charged to the budget; once the budget is
// full the drainer stops reading and every channel waits. The watcher
// says so before it happens, from the places that already run when it
// does, so it needs no goroutine or timer of its own:
//
//   - an outbox that queues an item checks its share of the budget (the
//     depth warning), and a consumer's inbox that queues a delivery checks
//     its share and the age of its oldest (inbox.go);
//   - an outbox's hand-over goroutine, which retries a blocked listener
//     every slice (at most 50 ms), checks the age of its head (the stall
//     warning) and, with DropStalledListener, gives the listener up;
//   - the drainer logs when it pauses for the budget, naming the biggest
//     holder, and when it reads again.
//
// Warnings about one listener (kind and channel) or consumer are at most
// one per WarnInterval, so a stall that lasts costs a line per interval,
// not one per slice.

// The defaults of DrainerOptions.StallWarning, DepthWarning (a fraction of
// the budget) and WarnInterval.
const (
	defaultStallWarning = 5 * time.Second
	defaultDepthWarning = 0.25
	defaultWarnInterval = 30 * time.Second
)

// watcher is the drainer's warnings and stall policy; nil when
// DrainerOptions set neither a Logger nor DropStalledListener.
type watcher struct {
	log       *slog.Logger // never nil: a discarding logger without Logger
	obs       *Observer
	budget    *budget
	stallAge  time.Duration // 0: no stall warning
	depth     int64         // bytes; 0: no depth warning
	interval  time.Duration
	dropAfter time.Duration // 0: never drop

	dropped atomic.Uint64

	mu   sync.Mutex
	last map[warnKey]time.Time
}

// warnKey is what a warning is about, for the rate limit.
type warnKey struct {
	what    string
	kind    ListenerKind
	channel uint16
	tag     string
}

// newWatcher returns the watcher that opts ask for, or nil.
func newWatcher(opts DrainerOptions, b *budget) *watcher {
	if opts.Logger == nil && opts.DropStalledListener <= 0 {
		return nil
	}
	w := &watcher{
		log:       opts.Logger,
		obs:       opts.Observer,
		budget:    b,
		stallAge:  opts.StallWarning,
		interval:  opts.WarnInterval,
		dropAfter: opts.DropStalledListener,
		last:      map[warnKey]time.Time{},
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case w.stallAge == 0:
		w.stallAge = defaultStallWarning
	case w.stallAge < 0:
		w.stallAge = 0
	}
	frac := opts.DepthWarning
	if frac == 0 {
		frac = defaultDepthWarning
	}
	if frac > 0 {
		w.depth = int64(frac * float64(b.high))
	}
	if w.interval <= 0 {
		w.interval = defaultWarnInterval
	}
	if w.dropAfter < 0 {
		w.dropAfter = 0
	}
	return w
}

// allow reports whether a warning about k may be logged now, and if so
// starts its interval.
func (w *watcher) allow(k warnKey) bool {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if at, ok := w.last[k]; ok && now.Sub(at) < w.interval {
		return false
	}
	w.last[k] = now
	return true
}

// queued runs after an outbox queued an item: the depth warning.
func (w *watcher) queued(o *outbox, h outboxHead) {
	if w.depth <= 0 || h.bytes < w.depth || h.kind == "" {
		return
	}
	if !w.allow(warnKey{what: "depth", kind: h.kind, channel: o.channel}) {
		return
	}
	w.log.LogAttrs(context.Background(), slog.LevelWarn, "amqp: a listener holds a large share of the read budget",
		slog.String("listener", string(h.kind)), slog.Int("channel", int(o.channel)),
		slog.Int("queued", h.items), slog.Int64("queued_bytes", h.bytes),
		slog.Duration("oldest", h.age), slog.Int64("budget", w.budget.high))
}

// consumerQueued runs after a consumer buffer took a delivery: the depth
// and stall warnings of consumers.
func (w *watcher) consumerQueued(st *bufferStat) {
	bytes := st.bytes.Load()
	var age time.Duration
	if at := st.oldest.Load(); at != 0 {
		age = time.Duration(monoNow() - at)
	}
	var what, msg string
	switch {
	case w.depth > 0 && bytes >= w.depth:
		what, msg = "depth", "amqp: a consumer's buffer holds a large share of the read budget"
	case w.stallAge > 0 && age >= w.stallAge:
		what, msg = "stall", "amqp: a consumer has not received its deliveries"
	default:
		return
	}
	if !w.allow(warnKey{what: what, kind: KindConsumer, channel: st.channel, tag: st.tag}) {
		return
	}
	w.log.LogAttrs(context.Background(), slog.LevelWarn, msg,
		slog.String("listener", string(KindConsumer)), slog.Int("channel", int(st.channel)),
		slog.String("consumer_tag", st.tag), slog.Int64("queued", st.queued.Load()),
		slog.Int64("queued_bytes", bytes), slog.Duration("oldest", age), slog.Int64("budget", w.budget.high))
}

// waiting runs on an outbox's hand-over goroutine each time a slice
// passed without the listener taking the head item, queued at at.
func (w *watcher) waiting(o *outbox, it outItem, at int64) {
	age := time.Duration(monoNow() - at)
	kind := it.kind()
	if w.stallAge > 0 && age >= w.stallAge && kind != "" &&
		w.allow(warnKey{what: "stall", kind: kind, channel: o.channel}) {
		h := o.holds()
		w.log.LogAttrs(context.Background(), slog.LevelWarn, "amqp: a listener has not read its notifications",
			slog.String("listener", string(kind)), slog.Int("channel", int(o.channel)),
			slog.Int("queued", h.items), slog.Int64("queued_bytes", h.bytes),
			slog.Duration("oldest", age), slog.Int64("budget", w.budget.high))
	}
	if w.dropAfter <= 0 || age < w.dropAfter || o.forget == nil {
		return
	}
	b, ok := it.(interface{ blocked() any })
	if !ok {
		return
	}
	l := b.blocked()
	if l == nil || !o.dropListener(l) {
		return
	}
	w.dropped.Add(1)
	h := o.holds()
	ls := ListenerStats{Kind: kind, Channel: o.channel, Queued: h.items, QueuedBytes: h.bytes, OldestAge: age}
	w.log.LogAttrs(context.Background(), slog.LevelError, "amqp: dropped a stalled listener: its chan is closed and what was queued for it is dropped",
		slog.String("listener", string(kind)), slog.Int("channel", int(o.channel)),
		slog.Duration("waited", age), slog.Duration("limit", w.dropAfter))
	if w.obs != nil && w.obs.ListenerDropped != nil {
		w.obs.ListenerDropped(ls)
	}
}

// outboxHead is what an outbox holds, for the warnings.
type outboxHead struct {
	kind  ListenerKind // of the item at the head
	items int          // notifications waiting, of every kind
	bytes int64
	age   time.Duration // of the item at the head
}

// holds describes what o holds now.
func (o *outbox) holds() outboxHead {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.headLocked(monoNow())
}

// headLocked is holds at now, with o.mu held.
func (o *outbox) headLocked(now int64) outboxHead {
	h := outboxHead{items: o.notes, bytes: o.bytes}
	if waiting := o.items.queued(); len(waiting) > 0 {
		q := waiting[0]
		h.kind, h.age = q.it.kind(), time.Duration(now-q.at)
	}
	return h
}

// dropListener gives up on listener l of o's owner: it is closed and
// unregistered (o.forget), and what is queued for it is skipped from now
// on. It reports false, closing nothing, if upstream has closed the
// listeners already, or l was dropped before or is no longer registered.
func (o *outbox) dropListener(l any) bool {
	o.lock.Lock()
	defer o.lock.Unlock()
	if *o.closed || o.dropped[l] {
		return false
	}
	if o.dropped == nil {
		o.dropped = map[any]bool{}
	}
	o.dropped[l] = true
	return o.forget(l)
}

// forgetListener unregisters and closes a listener that the stall policy
// gave up on. The caller holds ch.notifyM for writing, as upstream does
// when it closes the listeners, so the two never both close one chan: a
// listener that is no longer registered is left alone.
func (ch *Channel) forgetListener(l any) (found bool) {
	switch c := l.(type) {
	case chan Confirmation:
		ch.confirms.m.Lock()
		ch.confirms.listeners, found = closeAndRemove(ch.confirms.listeners, c)
		ch.confirms.m.Unlock()
	case chan Return:
		ch.returns, found = closeAndRemove(ch.returns, c)
	case chan bool:
		ch.flows, found = closeAndRemove(ch.flows, c)
	case chan string:
		ch.cancels, found = closeAndRemove(ch.cancels, c)
	}
	return found
}

// closeAndRemove closes c and removes it from ls, if it is there.
func closeAndRemove[T any](ls []chan T, c chan T) ([]chan T, bool) {
	i := slices.Index(ls, c)
	if i < 0 {
		return ls, false
	}
	close(c)
	return slices.Delete(ls, i, i+1), true
}

// listenerStats appends what waits in o, one entry per kind.
func (o *outbox) listenerStats(out []ListenerStats, now int64) []ListenerStats {
	o.mu.Lock()
	defer o.mu.Unlock()
	start := len(out)
	for _, q := range o.items.queued() {
		k := q.it.kind()
		if k == "" {
			continue
		}
		i := start
		for i < len(out) && out[i].Kind != k {
			i++
		}
		if i == len(out) {
			out = append(out, ListenerStats{Kind: k, Channel: o.channel})
		}
		out[i].Queued += itemCount(q.it)
		out[i].QueuedBytes += q.it.cost()
		if age := time.Duration(now - q.at); age > out[i].OldestAge {
			out[i].OldestAge = age
		}
	}
	return out
}

// itemCount is how many notifications an item holds.
func itemCount(it outItem) int {
	if c, ok := it.(interface{ count() int }); ok {
		return c.count()
	}
	return 1
}

// count is how many notifications an item with several holds (itemCount).
func (n *notes[T]) count() int   { return len(n.vs) }
func (s *settlement) count() int { return len(s.dcs) }

// biggestHolder is the listener or consumer that holds the most of the
// budget now (a consumer is reported with Kind "Consume").
func (d *drainConn) biggestHolder() ListenerStats {
	var s Stats
	d.stats(&s, time.Now())
	var best ListenerStats
	for _, l := range s.Listeners {
		if l.QueuedBytes > best.QueuedBytes {
			best = l
		}
	}
	for _, c := range s.Consumers {
		if c.QueuedBytes > best.QueuedBytes {
			best = ListenerStats{Kind: KindConsumer, Channel: c.Channel, Queued: c.Queued, QueuedBytes: c.QueuedBytes, OldestAge: c.OldestAge}
		}
	}
	return best
}

// pauseBegan runs when the drainer stops reading for the budget.
func (d *drainConn) pauseBegan() {
	d.budget.pauseBegan(time.Now())
	if d.watch == nil && (d.obs == nil || d.obs.BudgetPaused == nil) {
		return
	}
	holder := d.biggestHolder()
	info := BudgetInfo{Limit: d.budget.high, Used: d.budget.usedNow(), Holder: holder}
	d.pausedFor = holder
	if d.watch != nil {
		d.watch.log.LogAttrs(context.Background(), slog.LevelWarn, "amqp: read budget full: the drainer stopped reading the socket until listeners and consumers take what waits",
			slog.Int64("budget", info.Limit), slog.Int64("used", info.Used),
			slog.String("holder", string(holder.Kind)), slog.Int("holder_channel", int(holder.Channel)),
			slog.Int("holder_queued", holder.Queued), slog.Int64("holder_bytes", holder.QueuedBytes),
			slog.Duration("holder_oldest", holder.OldestAge))
	}
	if d.obs != nil && d.obs.BudgetPaused != nil {
		d.obs.BudgetPaused(info)
	}
}

// pauseEnded runs when the drainer reads again after a pause.
func (d *drainConn) pauseEnded() {
	took := d.budget.pauseEnded(time.Now())
	if d.watch == nil && (d.obs == nil || d.obs.BudgetResumed == nil) {
		return
	}
	info := BudgetInfo{Limit: d.budget.high, Used: d.budget.usedNow(), Paused: took, Holder: d.pausedFor}
	if d.watch != nil {
		d.watch.log.LogAttrs(context.Background(), slog.LevelWarn, "amqp: the drainer reads the socket again",
			slog.Duration("paused", took), slog.Int64("used", info.Used), slog.Int64("budget", info.Limit))
	}
	if d.obs != nil && d.obs.BudgetResumed != nil {
		d.obs.BudgetResumed(info)
	}
}
