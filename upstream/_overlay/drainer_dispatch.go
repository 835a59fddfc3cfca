// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"sync"
	"time"
)

// chanDispatcher runs a channel's frames, notifications in order; its waits delay only it.
type chanDispatcher struct {
	serialQueue
	out outbox
	d   *drainConn
	ch  *Channel
}

// route0 hands a channel-0 frame on, counted first: a caller it wakes must not take it for
// progress made after its DrainEvents began. stop ends reading (connection.close, or the
// error to fail with).
func (d *drainConn) route0(g *readGen, f frame) (stop bool, err *Error) {
	g.activity.frames.Add(1)
	mf, ok := f.(*methodFrame)
	if !ok {
		if _, beat := f.(*heartbeatFrame); !beat { // only these two on channel 0 (spec 4.2.3)
			d.conn0Work(func() { d.protocolClose(ErrUnexpectedFrame) })
		}
		return false, nil
	}
	if m, ok := mf.Method.(*connectionClose); ok {
		// As upstream: close-ok, then the teardown; nothing may follow it.
		err := newError(m.ReplyCode, m.ReplyText)
		d.conn0Work(func() {
			if err := d.c.send(&methodFrame{ChannelId: 0, Method: &connectionCloseOk{}}); err != nil {
				Logger.Printf("error sending connectionCloseOk, error: %+v", err)
			}
			d.c.shutdown(err)
		})
		return true, nil
	}
	if d.notifyBlocks(mf.Method) {
		return false, nil
	} else if err := g.replyOverflow(mf.Method); err != nil {
		return true, err
	}
	g.rpc <- mf.Method
	return false, nil
}

// dispatchClosed is upstream's Connection.dispatchClosed, for a frame on a channel not open.
func (d *drainConn) dispatchClosed(f frame) {
	mf, ok := f.(*methodFrame)
	if !ok {
		return
	}
	switch mf.Method.(type) {
	case *channelClose:
		if err := d.c.send(&methodFrame{ChannelId: f.channel(), Method: &channelCloseOk{}}); err != nil {
			Logger.Printf("error sending channelCloseOk, channel id: %d error: %+v", f.channel(), err)
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

// conn0Work runs channel-0 work that may block (writes, teardown) in order.
func (d *drainConn) conn0Work(job func()) {
	d.mu.Lock()
	if d.conn0 == nil {
		d.conn0 = &serialQueue{workQueue: workQueue[queuedJob]{budget: d.budget}}
	}
	q := d.conn0
	d.mu.Unlock()
	q.push(frameCost, job)
}

// handOn queues a channel frame's step for its dispatcher, counted first.
func (d *drainConn) handOn(g *readGen, step chanStep) {
	g.activity.frames.Add(1)
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

// dispatch queues a job for ch's dispatcher; a delivery with none before goes to its inbox at once.
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

// newDispatcher makes ch's dispatcher (d.mu held); a closed channel's goes once queue and outbox idle.
func (d *drainConn) newDispatcher(ch *Channel) *chanDispatcher {
	disp := &chanDispatcher{d: d, ch: ch}
	disp.budget, disp.outer, disp.work, disp.handleJob = d.budget, &d.mu, &d.jobs, disp.handle
	disp.linger, disp.ended = dispatcherLinger, d.genDead
	d.initOutbox(&disp.out, &ch.notifyM, &ch.noNotify)
	disp.out.outer, disp.out.channel, disp.out.forget = &d.mu, ch.id, ch.forgetListener
	disp.retired = func() bool {
		if ch.IsClosed() && disp.out.idle() {
			delete(d.dispatchers, ch)
			return false
		}
		return true
	}
	disp.out.retired = func() {
		if ch.IsClosed() && disp.idle() {
			delete(d.dispatchers, ch)
			disp.unpark() // to retire now, not after the linger
		}
	}
	return disp
}

// dispatcherLinger is how long an idle dispatcher parks (till a close or end): bursts share one.
const dispatcherLinger = time.Second

// genDead is closed when the current generation ends: dispatchers retire.
func (d *drainConn) genDead() <-chan struct{} {
	if g := d.current(); g != nil {
		return g.dead
	}
	return nil
}

// initOutbox sets up an outbox of this connection, guarded by lock.
func (d *drainConn) initOutbox(o *outbox, lock *sync.RWMutex, closed *bool) {
	o.lock, o.closed, o.budget, o.work = lock, closed, d.budget, &d.work
	o.closeWait, o.watch = d.opts.CloseTimeout, d.watch
}

// handle dispatches one method or complete message.
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

// listenersOf reads one of ch's listener lists under notifyM.
func listenersOf[T any](ch *Channel, ls *[]chan T) []chan T {
	ch.notifyM.RLock()
	defer ch.notifyM.RUnlock()
	return *ls
}

// Notification costs charged to the budget while a value waits in an outbox.
func confirmationCost(Confirmation) int64 { return frameCost }
func returnCost(r Return) int64           { return frameCost + int64(len(r.Body)) }
func boolCost(bool) int64                 { return frameCost }
func stringCost(s string) int64           { return frameCost + int64(len(s)) }
func blockingCost(b Blocking) int64       { return frameCost + int64(len(b.Reason)) }

// dispatchMessage is Channel.dispatch without waits on users: what they take goes via the outbox.
func (disp *chanDispatcher) dispatchMessage(msg message) {
	d, ch, out := disp.d, disp.ch, &disp.out
	switch m := msg.(type) {
	case *basicAck:
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
		if err := ch.send(&channelFlowOk{Active: m.Active}); err != nil {
			Logger.Printf("error sending channelFlowOk, channel id: %d error: %+v", ch.id, err)
		}
	case *basicCancel:
		disp.cancelled(m.ConsumerTag)
	case *basicDeliver:
		ch.consumers.deliver(m.ConsumerTag, newDelivery(ch, m))
	case *channelClose, *channelCloseOk: // listeners close next: notifications first
		out.closeInOrder(func() { ch.dispatch(msg) })
	default:
		ch.dispatch(msg)
	}
}

// cancelled is basic.cancel: NotifyCancel, then the deliveries chan
// closes (upstream's order); cancel-ok is serialised with publishes (ch.m).
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
			Logger.Printf("error sending basicCancelOk, channel id: %d error: %+v", ch.id, err)
		}
		ch.m.Unlock()
	}
	if queueName != "" {
		ch.connection.maybeDeleteRecordedAutoDeleteQueue(queueName)
	}
}

// confirm is upstream's confirms.One/Multiple, in order with the outbox; it never waits or drops.
func (d *drainConn) confirm(ch *Channel, out *outbox, conf Confirmation, multiple bool) {
	cf := ch.confirms
	cf.m.Lock()
	var settle *settlement
	switch {
	case !out.idle():
		// Taken now, lest reset or Close nack them too; only tags in [expecting, published] wait.
		cf.publishedMut.Lock()
		last := cf.published
		cf.publishedMut.Unlock()
		if conf.DeliveryTag < last {
			last = conf.DeliveryTag
		}
		if dcs := cf.deferredConfirmations.take(cf.expecting, last, conf.DeliveryTag, multiple); len(dcs) > 0 {
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

// sequence returns what conf releases, in tag order (the rest waits in cf.sequencer); confirms.m held.
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
	if multiple {
		for cf.expecting <= conf.DeliveryTag && cf.expecting <= published {
			next(Confirmation{DeliveryTag: cf.expecting, Ack: conf.Ack})
		}
	} else if conf.DeliveryTag > published { // nothing waits for it
	} else if cf.expecting == conf.DeliveryTag {
		next(conf)
	} else {
		cf.sequencer[conf.DeliveryTag] = conf
	}
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

// notifyBlocked hands b to the NotifyBlocked listeners ls, in order.
func (d *drainConn) notifyBlocked(ls []chan Blocking, b Blocking) {
	notifyAllInOrder(&d.connOut, ls, blockingCost, b)
}
