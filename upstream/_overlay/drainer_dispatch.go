// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"sync"
	"time"
)

// The drainer's dispatch: what the read turn's holder does with each routed frame. Upstream
// dispatches on its reader goroutine, so a NotifyPublish listener nobody reads (for up to 5 s a
// notification) or a cancel-ok waiting for ch.m stalls all reading on the connection. Here the
// holder never runs what may wait: channel 0's replies go into rpc (a buffered chan) and its
// writes to conn0Work, and each channel's frames go to that channel's dispatcher, a goroutine
// of its own that exists only while it has work (and a linger after). A listener's waits then
// happen on the outbox's goroutine: they delay only that channel's notifications, and, through
// the budget, reading only once too much waits.

// chanDispatcher runs a channel's methods and complete messages in frame order, on a
// serialQueue of its own; what its listeners take goes through its outbox, in order too. Its
// lock and its outbox's nest only under drainConn.mu (workQueue's doc says why).
//
// It stays in drainConn.dispatchers from its channel's first queued frame until the channel is
// closed and both its queue and its outbox are idle. While the channel is open, an idle
// dispatcher's goroutine ends after its linger but the dispatcher stays, so that later frames
// find the same outbox: a second outbox for one channel would hand notifications over beside
// the first's, out of frame order.
type chanDispatcher struct {
	serialQueue
	out outbox
	d   *drainConn
	ch  *Channel
}

// route0 hands a channel-0 frame on, upstream's dispatch0 without its waits. stop ends
// reading: after connection.close (the teardown follows on conn0Work), or with err to fail
// with.
func (d *drainConn) route0(g *readGen, f frame) (stop bool, err *Error) {
	mf, ok := f.(*methodFrame)
	if !ok {
		// Only methods and heartbeats come on channel 0 (spec 4.2.3). A heartbeat needs nothing
		// more: the read that brought it already reset the broker's silence clock (lastRecv).
		if _, beat := f.(*heartbeatFrame); !beat {
			d.conn0Work(func() { d.protocolClose(ErrUnexpectedFrame) })
		}
		return false, nil
	}
	if m, ok := mf.Method.(*connectionClose); ok {
		// As upstream: close-ok, then the teardown; nothing may follow it. Both may block
		// (the write on sendM), so they run on conn0Work, and reading stops here.
		err := newError(m.ReplyCode, m.ReplyText)
		d.conn0Work(func() {
			closeOk := &methodFrame{ChannelId: 0, Method: &connectionCloseOk{}}
			if err := d.c.send(closeOk); err != nil {
				Logger.Printf("error sending connectionCloseOk, error: %+v", err)
			}
			d.c.shutdown(err)
		})
		return true, nil
	}
	// connection.blocked and unblocked go to the publish gate and, through connOut, to their
	// listeners; any other method is a reply for a caller, as in upstream's dispatch0.
	if d.notifyBlocks(mf.Method) {
		return false, nil
	} else if err := g.replyOverflow(mf.Method); err != nil {
		return true, err
	}
	// A reply: rpc has room (replyOverflow), so the send does not wait for the caller. Only the
	// turn's holder sends on rpc, one step at a time, so the room it saw is still there.
	g.rpc <- mf.Method
	return false, nil
}

// dispatchClosed is upstream's Connection.dispatchClosed, for a frame on a channel not open:
// answer a close with close-ok, ignore a close-ok, and close the connection for anything else.
// It writes, so it runs on conn0Work.
func (d *drainConn) dispatchClosed(f frame) {
	mf, ok := f.(*methodFrame)
	if !ok {
		return
	}
	switch mf.Method.(type) {
	case *channelClose:
		closeOk := &methodFrame{ChannelId: f.channel(), Method: &channelCloseOk{}}
		if err := d.c.send(closeOk); err != nil {
			Logger.Printf("error sending channelCloseOk, channel id: %d error: %+v",
				f.channel(), err)
		}
	case *channelCloseOk:
	default:
		d.protocolClose(ErrClosed)
	}
}

// protocolClose closes for a broker's protocol error: waiters get err, not ErrClosedIntentionally.
func (d *drainConn) protocolClose(err *Error) {
	d.markProtocol()
	if cerr := d.c.closeWith(err); cerr != nil {
		Logger.Printf("error closing the connection with %v: %+v", err, cerr)
	}
}

// conn0Work runs channel-0 work that may block (writes, teardown) in order, on a queue of its
// own: the turn's holder must not wait for sendM or for a shutdown.
//
// conn0 has no linger and is counted in neither jobs nor work: its goroutine ends when it is
// empty, and a shutdown's flush does not wait for it, since the teardown (d.c.shutdown, which
// flushes) runs on it and would wait for itself.
func (d *drainConn) conn0Work(job func()) { d.conn0.push(frameCost, job) }

// handOn queues a channel frame's step for its dispatcher. A job is charged a frame's
// overhead, plus its body, until it ran: what waits for a slow dispatcher counts toward the
// budget as a delivery in an inbox does.
func (d *drainConn) handOn(step chanStep) {
	switch {
	case step.closed != nil:
		d.conn0Work(func() { d.dispatchClosed(step.closed) })
	case step.method != nil:
		d.dispatch(step.ch, queuedJob{f: step.method, cost: frameCost})
	case step.del != nil:
		d.dispatch(step.ch, queuedJob{del: step.del, cost: frameCost + int64(len(step.del.Body))})
	case step.msg != nil:
		_, body := step.msg.getContent()
		d.dispatch(step.ch, queuedJob{msg: step.msg, cost: frameCost + int64(len(body))})
	}
}

// dispatch queues a job for ch's dispatcher. A delivery with nothing of its channel queued
// before it goes to its inbox at once, on the turn's holder: an inbox put never waits, and with
// no job before it, nothing could come out of order. Under drainConn.mu, the lookup, the idle
// check and the put are one step against the dispatcher's retiring (workQueue's doc).
//
// The shortcut is for deliveries only: a method may wait (for ch.m, a write, a listener's
// room), which the turn's holder must not. Jobs reach a dispatcher only here, from the turn's
// holder, so an idle one has none that this delivery could overtake.
func (d *drainConn) dispatch(ch *Channel, job queuedJob) {
	d.mu.Lock()
	disp := d.dispatchers[ch]
	if job.del != nil && (disp == nil || disp.idle()) {
		d.mu.Unlock()
		ch.consumers.deliver(job.del.ConsumerTag, job.del)
		return
	}
	if disp == nil {
		disp = d.newDispatcher(ch)
		d.dispatchers[ch] = disp
	}
	disp.pushJob(job)
	d.mu.Unlock()
}

// newDispatcher makes ch's dispatcher (d.mu held). A closed channel's is removed from the map
// once both its queue and its outbox are idle: each side's retired func checks the other, under
// drainConn.mu, their shared outer lock (workQueue's doc).
func (d *drainConn) newDispatcher(ch *Channel) *chanDispatcher {
	disp := &chanDispatcher{d: d, ch: ch}
	disp.budget = d.budget
	disp.outer = &d.mu
	// Its jobs count in d.jobs, which a channel's caller whose wait the generation's end cut short
	// waits on (replyWins: its reply may be queued here), its outbox's items in d.work
	// (initOutbox); a shutdown's flush waits for both.
	disp.work = &d.jobs
	disp.handleJob = disp.handle
	disp.linger = dispatcherLinger
	disp.ended = d.genDead
	d.initOutbox(&disp.out, &ch.notifyM, &ch.noNotify)
	disp.out.outer = &d.mu
	disp.out.channel = ch.id
	disp.out.forget = ch.forgetListener
	// The dispatcher's queue is empty (under its mu): retire if the outbox is idle too, else
	// park, and the outbox retires both once it empties.
	disp.retired = func() bool {
		if ch.IsClosed() && disp.out.idle() {
			delete(d.dispatchers, ch)
			return false
		}
		return true
	}
	// The outbox is empty (under its mu): if the dispatcher is idle too, retire it now.
	disp.out.retired = func() {
		if ch.IsClosed() && disp.idle() {
			delete(d.dispatchers, ch)
			disp.unpark() // to retire now, not after the linger
		}
	}
	return disp
}

// dispatcherLinger is how long an idle dispatcher parks (unless its channel closes or the
// generation ends first): the bursts of a busy channel share one goroutine.
const dispatcherLinger = time.Second

// genDead is closed when the current generation ends: parked dispatchers retire, as the
// channels they served are gone with it. It is asked each time the goroutine parks
// (parkUntilPut), so a dispatcher that outlives a recovery watches the generation current then.
func (d *drainConn) genDead() <-chan struct{} {
	if g := d.generation(); g != nil {
		return g.dead
	}
	return nil
}

// initOutbox sets up an outbox of this connection. lock is its owner's notifyM and closed its
// noNotify: upstream closes the listeners under lock, so a hand-over holds it (read side).
// closeWait is CloseTimeout: a close drops what the listeners left unread after that long
// (closeInOrder), which is what keeps Close bounded behind an unread listener.
func (d *drainConn) initOutbox(o *outbox, lock *sync.RWMutex, closed *bool) {
	o.lock = lock
	o.closed = closed
	o.budget = d.budget
	o.work = &d.work
	o.closeWait = d.opts.CloseTimeout
	o.watch = d.watch
}

// handle dispatches one method or complete message, on the dispatcher's goroutine. A fast
// delivery (del) comes here only when jobs of its channel were queued before it (dispatch): it
// reaches its inbox after them, in frame order.
func (disp *chanDispatcher) handle(job queuedJob) {
	switch {
	case job.del != nil:
		disp.ch.consumers.deliver(job.del.ConsumerTag, job.del)
	case job.msg != nil:
		disp.dispatchMessage(job.msg)
	default:
		disp.dispatchMessage(job.f.(*methodFrame).Method)
	}
}

// listenersOf reads one of ch's listener lists under notifyM. The slice is used after the lock
// is let go, by a queued hand-over too: this holds because nobody changes a list's elements in
// place (upstream appends; forgetListener makes a new slice, closeAndRemove).
func listenersOf[T any](ch *Channel, ls *[]chan T) []chan T {
	ch.notifyM.RLock()
	defer ch.notifyM.RUnlock()
	return *ls
}

// Notification costs charged to the budget while a value waits in an outbox: a frame's
// overhead plus what the value holds.
func confirmationCost(Confirmation) int64 { return frameCost }
func returnCost(r Return) int64           { return frameCost + int64(len(r.Body)) }
func boolCost(bool) int64                 { return frameCost }
func stringCost(s string) int64           { return frameCost + int64(len(s)) }
func blockingCost(b Blocking) int64       { return frameCost + int64(len(b.Reason)) }

// dispatchMessage is Channel.dispatch without waits on users: what listeners take goes via the
// outbox, in frame order; what upstream does without waiting runs as upstream wrote it.
func (disp *chanDispatcher) dispatchMessage(msg message) {
	d, ch, out := disp.d, disp.ch, &disp.out
	switch m := msg.(type) {
	case *basicAck:
		// Only in confirm mode, as upstream.
		if ch.confirming.Load() {
			d.confirm(ch, out, Confirmation{DeliveryTag: m.DeliveryTag, Ack: true}, m.Multiple)
		}
	case *basicNack:
		if ch.confirming.Load() {
			d.confirm(ch, out, Confirmation{DeliveryTag: m.DeliveryTag, Ack: false}, m.Multiple)
		}
	case *basicReturn:
		notifyAllInOrder(out, listenersOf(ch, &ch.returns), returnCost, *newReturn(*m))
	case *channelFlow:
		notifyAllInOrder(out, listenersOf(ch, &ch.flows), boolCost, m.Active)
		// flow-ok is written here, as upstream writes it from dispatch: the write may wait for
		// sendM, which the dispatcher may, and the turn's holder may not.
		if err := ch.send(&channelFlowOk{Active: m.Active}); err != nil {
			Logger.Printf("error sending channelFlowOk, channel id: %d error: %+v",
				ch.id, err)
		}
	case *basicCancel:
		disp.cancelled(m.ConsumerTag)
	case *basicDeliver:
		// A basic.deliver the fast path refused, parsed and assembled by upstream's rules.
		ch.consumers.deliver(m.ConsumerTag, newDelivery(ch, m))
	case *channelClose, *channelCloseOk:
		// Upstream closes the listeners next: what was queued for them goes first, or is
		// dropped after CloseTimeout (closeInOrder), so that a close is bounded.
		out.closeInOrder(func() { ch.dispatch(msg) })
	default:
		ch.dispatch(msg)
	}
}

// cancelled is basic.cancel: NotifyCancel, then the deliveries chan closes (upstream's order,
// kept through the outbox); cancel-ok is serialised with publishes (ch.m), which is why this
// runs on the dispatcher, never on the turn's holder.
func (disp *chanDispatcher) cancelled(tag string) {
	ch, out := disp.ch, &disp.out
	queueName, _ := ch.consumers.queueForTag(tag)
	notifyAllInOrder(out, listenersOf(ch, &ch.cancels), stringCost, tag)
	if in := ch.consumers.inboundChan(tag); in != nil {
		out.inOrder(func() { ch.consumers.cancelFedBy(tag, in) })
	}
	if ch.connection.isCapable(serverCapabilityAcceptConsumerCancelOk) {
		ch.m.Lock()
		if err := ch.send(&basicCancelOk{ConsumerTag: tag}); err != nil {
			Logger.Printf("error sending basicCancelOk, channel id: %d error: %+v",
				ch.id, err)
		}
		ch.m.Unlock()
	}
	if queueName != "" {
		ch.connection.maybeDeleteRecordedAutoDeleteQueue(queueName)
	}
}

// confirm is upstream's confirms.One/Multiple, in order with the outbox; it never waits or
// drops. With the outbox idle it settles the DeferredConfirmations at once, as upstream. With
// notifications waiting (a basic.return before this ack, held by a slow listener), it takes
// the DeferredConfirmations out of their set now and settles them through the outbox, after
// what is queued: a return is seen before the confirm of its publish, as upstream promises.
// Locks: under confirms.m, publishedMut and then deferredConfirmations.m (take), one at a
// time, as upstream's confirms.One takes them.
func (d *drainConn) confirm(ch *Channel, out *outbox, conf Confirmation, multiple bool) {
	cf := ch.confirms
	cf.m.Lock()
	var settle *settlement
	switch {
	case !out.idle():
		// Taken now, lest reset or Close nack them too; only tags in [expecting, published]
		// wait, so the walk is bounded by what was published.
		cf.publishedMut.Lock()
		last := minOf(cf.published, conf.DeliveryTag)
		cf.publishedMut.Unlock()
		dcs := cf.deferredConfirmations.take(cf.expecting, last, conf.DeliveryTag, multiple)
		if len(dcs) > 0 {
			settle = &settlement{dcs: dcs, ack: conf.Ack}
		}
	case multiple:
		cf.deferredConfirmations.ConfirmMultiple(conf)
	default:
		cf.deferredConfirmations.Confirm(conf)
	}
	ordered := sequence(ch, conf, multiple)
	listeners := cf.listeners
	cf.m.Unlock()
	if settle != nil {
		out.queue(settle)
	}
	notifyAllInOrder(out, listeners, confirmationCost, ordered...)
}

// sequence returns what conf releases for the NotifyPublish listeners, in tag order, as
// upstream's resequence: a confirm that comes before an earlier tag's waits in cf.sequencer
// until the gap is filled. confirms.m is held.
func sequence(ch *Channel, conf Confirmation, multiple bool) []Confirmation {
	cf := ch.confirms
	var ordered []Confirmation
	next := func(c Confirmation) {
		delete(cf.sequencer, cf.expecting)
		cf.expecting++
		ordered = append(ordered, c)
	}
	// Unlike upstream, only published tags: a bogus 2^40 costs no loop (FuzzConnection).
	cf.publishedMut.Lock()
	published := cf.published
	cf.publishedMut.Unlock()
	// Release conf, or hold it: multiple releases every tag up to conf's, each with conf's
	// verdict; a single tag goes now only if it is the next expected.
	if multiple {
		for cf.expecting <= conf.DeliveryTag && cf.expecting <= published {
			next(Confirmation{DeliveryTag: cf.expecting, Ack: conf.Ack})
		}
	} else if conf.DeliveryTag > published {
		// Not published: nothing waits for it.
	} else if cf.expecting == conf.DeliveryTag {
		next(conf)
	} else {
		cf.sequencer[conf.DeliveryTag] = conf
	}
	// Then what the sequencer held that is now next in line.
	cf.publishedMut.Lock()
	for cf.expecting <= cf.published {
		held, found := cf.sequencer[cf.expecting]
		if !found {
			break
		}
		next(held)
	}
	cf.publishedMut.Unlock()
	return ordered
}

// notifyBlocked hands b to the NotifyBlocked listeners ls, in order, through the connection's
// outbox: the turn's holder never waits for a listener.
func (d *drainConn) notifyBlocked(ls []chan Blocking, b Blocking) {
	notifyAllInOrder(&d.connOut, ls, blockingCost, b)
}
