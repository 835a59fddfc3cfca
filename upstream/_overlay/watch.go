// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The defaults of DrainerOptions.StallWarning, DepthWarning (a fraction of the budget) and
// WarnInterval.
const (
	defaultStallWarning = 5 * time.Second
	defaultDepthWarning = 0.25
	defaultWarnInterval = 30 * time.Second
)

// watcher warns before a stalled listener fills the budget (stalling every channel), at most
// once an interval per sort, listener kind or consumer, and applies the stall policy
// (DropStalledListener). It is nil without DrainerOptions.Logger and DropStalledListener.
//
// Why it exists: an application that stops reading one NotifyReturn chan, or one consumer's
// deliveries, makes the budget fill with what waits for it, and then the drainer stops reading
// the socket for every channel. Without a warning, that looks like a broker gone quiet.
//
// It runs from code that runs anyway, with no goroutine or timer of its own: after an outbox
// queues (queued) and after each slice a hand-over waited (waiting), after a consumer's inbox
// queued (consumerQueued), and when reading pauses and resumes. None of these holds a lock when
// it calls in, since the Logger is user code; mu, a leaf lock, guards only the rate limit.
//
// The stall policy is the way out when a warning is not enough. A channel's notifications are
// handed over in frame order, so one unread listener holds every later notification and
// confirmation of its channel behind it, and, once they fill the budget, reading for the whole
// connection. Dropping closes that listener's chan, as upstream closes listeners when a channel
// closes, so that a range over it ends instead of hanging, and the hand-over goes on to the
// others. A NotifyBlocked listener is never dropped (waiting).
type watcher struct {
	// log is never nil: a discarding logger without Logger, when the stall policy runs alone.
	log       *slog.Logger
	obs       *Observer     // for ListenerDropped; nil for none
	budget    *budget       // the warnings report its high mark
	stallAge  time.Duration // ≤ 0: no stall warning
	depth     int64         // bytes; ≤ 0: no depth warning
	interval  time.Duration // the least time between two warnings with one key
	dropAfter time.Duration // ≤ 0: never drop

	// dropped counts the listeners dropped, for Stats, which reads it without taking mu.
	dropped atomic.Uint64

	// mu is shared by every outbox's goroutine, the dispatchers and the read turn's holder, which
	// call in concurrently; it is held only for one lookup and store of last, never while logging.
	mu   sync.Mutex
	last map[warnKey]time.Time // when each warning was last logged
}

// warnKey is what a warning is about, for the rate limit: its sort (depth, stall), and the
// listener kind and channel, or the consumer's channel and tag. It holds ids, not pointers to
// an outbox or inbox: an entry keeps nothing alive, and a channel reopened with the same id
// shares its predecessor's interval, so a reopen cannot reset the rate limit.
type warnKey struct {
	what    string
	kind    ListenerKind
	channel uint16
	tag     string
}

// newWatcher returns the watcher that opts ask for, or nil. nil, rather than a watcher that
// does nothing, lets every caller skip it with one nil check (outbox.queue, outbox.runItem,
// consumers.deliver): a connection with no Logger and no stall policy takes no lock here.
func newWatcher(opts DrainerOptions, b *budget) *watcher {
	if opts.Logger == nil && opts.DropStalledListener <= 0 {
		return nil
	}
	w := &watcher{
		log:       cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)),
		obs:       opts.Observer,
		budget:    b,
		interval:  opts.WarnInterval,
		stallAge:  cmp.Or(opts.StallWarning, defaultStallWarning),
		dropAfter: opts.DropStalledListener,
		last:      map[warnKey]time.Time{},
	}
	// For the two warnings, zero means the default and a negative value means never
	// (DrainerOptions); an interval has no "never", so anything ≤ 0 is the default.
	if w.interval <= 0 {
		w.interval = defaultWarnInterval
	}
	if frac := cmp.Or(opts.DepthWarning, defaultDepthWarning); frac > 0 {
		w.depth = int64(frac * float64(b.high))
	}
	return w
}

// allow reports whether a warning about k may be logged now, starting its interval. The map
// keeps an entry per key ever warned about: a warning is logged at most once an interval per
// key, however many items or deliveries trip it.
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

// warnOutbox logs a warning about what an outbox holds, h, for h.Kind, the oldest aged
// h.OldestAge. Its callers hold no lock (h was taken under o.mu, then the lock let go): the
// Logger is user code, which may block or call back into the connection.
func (w *watcher) warnOutbox(msg string, h ListenerStats) {
	w.log.LogAttrs(context.Background(), slog.LevelWarn, msg,
		slog.String("listener", string(h.Kind)), slog.Int("channel", int(h.Channel)),
		slog.Int("queued", h.Queued), slog.Int64("queued_bytes", h.QueuedBytes),
		slog.Duration("oldest", h.OldestAge), slog.Int64("budget", w.budget.high))
}

// queued runs after an outbox queued an item: the depth warning. The stall warning waits for
// waiting, since a just-queued item has not waited yet.
func (w *watcher) queued(o *outbox, h ListenerStats) {
	// h.QueuedBytes is what the whole outbox holds, but the warning names the head item's kind:
	// items are handed over in frame order, so all behind the head wait for its listener, the
	// likeliest cause. An action at the head (kind "") names no listener, and is not warned about.
	if w.depth > 0 && h.QueuedBytes >= w.depth && h.Kind != "" &&
		w.allow(warnKey{what: "depth", kind: h.Kind, channel: o.channel}) {
		w.warnOutbox("amqp: a listener holds a large share of the read budget", h)
	}
}

// consumerQueued runs after a consumer's inbox queued a delivery: its depth or stall warning.
// A consumer is never dropped: its deliveries are the broker's to requeue, not ours to lose.
//
// It runs only when consumers.deliver queued a delivery, on whoever delivered it, after the
// consumers' mutex is let go. A consumer that stopped taking after the broker stopped sending
// to it (its prefetch reached) is therefore not warned about again; Stats still shows its age.
// The figures come from bufferStat's atomics, without inbox.mu: a warning may be one delivery
// late, which does not matter for a warning.
func (w *watcher) consumerQueued(st *bufferStat) {
	cs := st.stats(monoNow()) // OldestAge is 0 once the inbox was emptied
	// One warning a delivery at most, depth first: a deep inbox is what threatens the budget.
	var what, msg string
	switch {
	case w.depth > 0 && cs.QueuedBytes >= w.depth:
		what, msg = "depth", "amqp: a consumer's buffer holds a large share of the read budget"
	case w.stallAge > 0 && cs.OldestAge >= w.stallAge:
		what, msg = "stall", "amqp: a consumer has not received its deliveries"
	default:
		return
	}
	if !w.allow(warnKey{what: what, kind: KindConsumer, channel: cs.Channel, tag: cs.ConsumerTag}) {
		return
	}
	w.log.LogAttrs(context.Background(), slog.LevelWarn, msg,
		slog.String("listener", string(KindConsumer)), slog.Int("channel", int(cs.Channel)),
		slog.String("consumer_tag", cs.ConsumerTag), slog.Int("queued", cs.Queued),
		slog.Int64("queued_bytes", cs.QueuedBytes), slog.Duration("oldest", cs.OldestAge),
		slog.Int64("budget", w.budget.high))
}

// waiting runs on the outbox's goroutine after each slice the head item (queued at at) waited:
// the stall warning, then the stall policy, which past dropAfter gives up the listener the
// hand-over waits for, closing its chan, so that its channel's other listeners go on.
// It runs between two slices (runItem), when the hand-over has let go of the notify lock's read
// side, which dropListener then takes for writing.
func (w *watcher) waiting(o *outbox, it outItem, at int64) {
	age := time.Duration(monoNow() - at)
	kind := it.kind()
	if w.stallAge > 0 && age >= w.stallAge && kind != "" &&
		w.allow(warnKey{what: "stall", kind: kind, channel: o.channel}) {
		w.warnOutbox("amqp: a listener has not read its notifications", o.holds(kind, age))
	}
	// forget is nil for the connection's outbox: its NotifyBlocked listeners are never dropped.
	if w.dropAfter <= 0 || age < w.dropAfter || o.forget == nil {
		return
	}
	// Only notifications name the listener they wait for: an action or a settlement waits for
	// none, and is never the stall's cause.
	b, ok := it.(interface{ blocked() any })
	if !ok || b.blocked() == nil || !o.dropListener(b.blocked()) {
		return
	}
	// From here the hand-over skips that listener (o.dropped) and goes on with the others on its
	// next slice; what was queued for it in later items is skipped too.
	w.dropped.Add(1)
	h := o.holds(kind, age)
	msg := "amqp: dropped a stalled listener: its chan is closed and what was queued for it" +
		" is dropped"
	w.log.LogAttrs(context.Background(), slog.LevelError, msg,
		slog.String("listener", string(kind)), slog.Int("channel", int(o.channel)),
		slog.Duration("waited", age), slog.Duration("limit", w.dropAfter))
	if w.obs != nil && w.obs.ListenerDropped != nil {
		w.obs.ListenerDropped(h)
	}
}

// holds describes what o holds now, for the warnings about an item of kind that waited age:
// Queued counts the notifications waiting, of every kind, and QueuedBytes their cost. It is
// taken under o.mu, then logged with no lock held.
func (o *outbox) holds(kind ListenerKind, age time.Duration) ListenerStats {
	o.mu.Lock()
	defer o.mu.Unlock()
	return ListenerStats{Kind: kind, Channel: o.channel, Queued: o.notes, QueuedBytes: o.bytes,
		OldestAge: age}
}

// headLocked is what o holds at now, with o.mu held, named for its head item: that item's
// kind and age. queue passes its put's own clock reading, for the depth warning, rather than
// read the clock a second time.
func (o *outbox) headLocked(now int64) ListenerStats {
	h := ListenerStats{Channel: o.channel, Queued: o.notes, QueuedBytes: o.bytes}
	if waiting := o.items.queued(); len(waiting) > 0 {
		h.Kind = waiting[0].it.kind()
		h.OldestAge = time.Duration(now - waiting[0].at)
	}
	return h
}

// dropListener closes and unregisters l (o.forget) and skips what is queued for it from now
// on; false, closing nothing, if upstream closed the listeners or l is dropped or unregistered.
// It holds the notify lock's write side, as upstream does to close listeners: no hand-over is
// under way meanwhile, and upstream cannot close l too.
//
// Its checks under that lock keep a chan from being closed twice, which panics: upstream sets
// *closed when it has closed every listener (noNotify, in closeResources), and dropped
// remembers the listeners closed here.
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

// forgetListener unregisters and closes a listener the stall policy gave up on. The caller
// holds ch.notifyM for writing, as upstream when it closes the listeners: never both close one
// chan. NotifyPublish's list is also guarded by confirms.m, which confirm holds to read it.
//
// Removing l from its list does two things: no new notification is queued for it (listenersOf
// and confirm read the lists), and upstream's closeResources, which closes every listener in
// the lists when the channel closes, does not close it a second time.
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

// closeAndRemove closes c and returns ls without it, if it is there. The result is a new slice:
// a queued hand-over keeps the old list (listenersOf), and slices.Delete in place would shift
// its listeners under it and zero its last, a nil chan that nothing could ever be sent to.
func closeAndRemove[T any](ls []chan T, c chan T) ([]chan T, bool) {
	i := slices.Index(ls, c)
	if i < 0 {
		return ls, false
	}
	close(c)
	return slices.Delete(slices.Clone(ls), i, i+1), true
}

// listenerStats appends what waits in o, one entry per kind (actions, of no kind, aside).
func (o *outbox) listenerStats(out []ListenerStats, now int64) []ListenerStats {
	o.mu.Lock()
	defer o.mu.Unlock()
	// This outbox's entries are out[start:], one per kind met: a handful at most, so a scan
	// costs less than a map.
	start := len(out)
	for _, q := range o.items.queued() {
		k := q.it.kind()
		if k == "" {
			continue // an action: no listener's
		}
		i := start
		for i < len(out) && out[i].Kind != k {
			i++
		}
		if i == len(out) {
			out = append(out, ListenerStats{Kind: k, Channel: o.channel})
		}
		out[i].Queued += q.it.count()
		out[i].QueuedBytes += q.it.cost()
		if age := time.Duration(now - q.at); age > out[i].OldestAge {
			out[i].OldestAge = age
		}
	}
	return out
}

// biggestHolder is the listener or consumer holding the most of the budget: what a pause's
// warning names, as the likely cause.
func (d *drainConn) biggestHolder() ListenerStats {
	// A whole Stats walk, but only once a pause begins. It runs on the drainer goroutine with
	// no lock held (pause), so the walk's locks (drainConn.mu, each outbox's mu) are free.
	var s Stats
	d.stats(&s, time.Now())
	// The consumers join the listeners after them, so that a tie goes to the listener.
	for _, c := range s.Consumers {
		s.Listeners = append(s.Listeners, ListenerStats{
			Kind:        KindConsumer,
			Channel:     c.Channel,
			Queued:      c.Queued,
			QueuedBytes: c.QueuedBytes,
			OldestAge:   c.OldestAge,
		})
	}
	var best ListenerStats
	for _, l := range s.Listeners {
		if l.QueuedBytes > best.QueuedBytes {
			best = l
		}
	}
	return best
}

// pauseBegan runs when the drainer stops reading for the budget. The holder found now is kept
// (pausedFor, the drainer goroutine's) so that the resume reports the same cause.
func (d *drainConn) pauseBegan() {
	// Stats counts every pause, whether or not anybody is told of it.
	d.budget.pauseBegan(time.Now())
	if d.watch == nil && (d.obs == nil || d.obs.BudgetPaused == nil) {
		return // nobody to tell: spare the Stats walk
	}
	holder := d.biggestHolder()
	d.pausedFor = holder
	info := d.budgetInfo(0)
	if d.watch != nil {
		msg := "amqp: read budget full: the drainer stopped reading the socket until" +
			" listeners and consumers take what waits"
		d.watch.log.LogAttrs(context.Background(), slog.LevelWarn, msg,
			slog.Int64("budget", info.Limit), slog.Int64("used", info.Used),
			slog.String("holder", string(holder.Kind)),
			slog.Int("holder_channel", int(holder.Channel)),
			slog.Int("holder_queued", holder.Queued),
			slog.Int64("holder_bytes", holder.QueuedBytes),
			slog.Duration("holder_oldest", holder.OldestAge))
	}
	if d.obs != nil && d.obs.BudgetPaused != nil {
		d.obs.BudgetPaused(info)
	}
}

// pauseEnded runs when the drainer reads again after a pause, or when the generation ended
// during it; either way the pause's length goes to Stats. pausedFor is stale when pauseBegan
// returned early, but then nobody is told here either: watch and obs are fixed at attach.
func (d *drainConn) pauseEnded() {
	took := d.budget.pauseEnded(time.Now())
	info := d.budgetInfo(took)
	if d.watch != nil {
		d.watch.log.LogAttrs(context.Background(), slog.LevelWarn,
			"amqp: the drainer reads the socket again",
			slog.Duration("paused", took), slog.Int64("used", info.Used),
			slog.Int64("budget", info.Limit))
	}
	if d.obs != nil && d.obs.BudgetResumed != nil {
		d.obs.BudgetResumed(info)
	}
}

// budgetInfo is what a pause's warning and the Observer hear: the budget, its use now, and
// the pause's cause (pausedFor) and length (paused, once it ended).
func (d *drainConn) budgetInfo(paused time.Duration) BudgetInfo {
	return BudgetInfo{Limit: d.budget.high, Used: d.budget.usedNow(), Paused: paused,
		Holder: d.pausedFor}
}
