// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"sync"
	"time"
)

// How the drainer hands frames on without waiting for anyone.
//
// Channel-0 methods are handled on the drainer goroutine: replies go to a
// buffered rpc chan, blocked/unblocked to the connection's outbox, and
// connection.close ends reading while the channel-0 queue (conn0Work, a
// goroutine that retires once it is empty) writes close-ok and tears the
// connection down, which releases every waiter with the broker's reason.
// Channel frames are queued, in order, for that channel's dispatcher (a
// delivery with nothing queued before it goes straight to its consumer's
// inbox): a goroutine that runs while the channel has frames waiting, then
// stays parked for the next ones for dispatcherLinger (less if the channel
// closes or the generation ends), and is gone after that with nothing
// queued (workqueue.go). It dispatches each method and complete message
// (content is assembled by the drainer). It may wait for the channel's
// lock or write to the socket (close-ok, flow-ok, cancel-ok), which only
// ever delays that one channel, never the drainer or another channel.
// Notifications go to the channel's outbox (outbox.go), which hands them
// over in arrival order, and drops one only with its listener
// (DropStalledListener) or once a close has waited for it long enough
// (closeInOrder, flush).

// chanDispatcher is one channel's dispatcher: its queue, which runs the
// channel's methods and complete messages in order, and its outbox, which
// hands the channel's notifications over in the same order. Content is
// assembled before, by the drainer (fastread.go).
type chanDispatcher struct {
	serialQueue
	out outbox
	d   *drainConn
	ch  *Channel
}

// route hands one frame of channel 0 on. It reports stop when the drainer
// must stop reading: after connection.close, or with the error to fail the
// connection with.
func (d *drainConn) route(g *drainGen, f frame) (stop bool, err *Error) {
	c := d.c
	mf, ok := f.(*methodFrame)
	if !ok {
		if _, beat := f.(*heartbeatFrame); beat {
			return false, nil
		}
		// Channel 0 carries only methods and heartbeats (spec 4.2.3).
		d.conn0Work(func() { d.protocolClose(ErrUnexpectedFrame) })
		return false, nil
	}
	switch m := mf.Method.(type) {
	case *connectionClose:
		// As upstream: close-ok goes out before the teardown releases the
		// waiters (with the broker's reason), but it is written off the
		// drainer, which stops reading: nothing may follow connection.close.
		err := newError(m.ReplyCode, m.ReplyText)
		d.conn0Work(func() {
			if err := c.send(&methodFrame{ChannelId: 0, Method: &connectionCloseOk{}}); err != nil {
				Logger.Printf("error sending connectionCloseOk, error: %+v", err)
			}
			c.shutdown(err)
		})
		return true, nil
	default:
		if d.notifyBlocks(m) {
			return false, nil
		}
		if err := g.replyOverflow(m); err != nil {
			return true, err
		}
		g.rpc <- m
	}
	return false, nil
}

// dispatchClosed is upstream's Connection.dispatchClosed for a frame on a
// channel that is not open: answer channel.close, ignore close-ok and
// content, and close the connection on any other method.
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

// protocolClose closes the connection because the broker broke the
// protocol. It goes through upstream's closeWith, whose close is not the
// application's: waiters must get err, not ErrClosedIntentionally.
func (d *drainConn) protocolClose(err *Error) {
	d.markProtocol()
	if cerr := d.c.closeWith(err); cerr != nil {
		Logger.Printf("error closing the connection with %v: %+v", err, cerr)
	}
}

// conn0Work runs channel-0 work that may block (network writes, teardown)
// in order, off the drainer.
func (d *drainConn) conn0Work(job func()) {
	d.mu.Lock()
	if d.conn0 == nil {
		d.conn0 = &serialQueue{workQueue: workQueue[queuedJob]{budget: d.budget}}
	}
	q := d.conn0
	d.mu.Unlock()
	q.push(frameCost, job)
}

// handOn queues what one frame of a channel came to (routeChannel) for
// the channel's dispatcher: methods and complete messages.
func (g *drainGen) handOn(step chanStep) {
	d := g.d
	g.activity.frames.Add(1) // counted first, as in route0
	switch {
	case step.closed != nil:
		// Upstream answers channel.close, ignores close-ok and closes the
		// connection on any other method; content was dropped.
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

// dispatch queues a job for the channel's dispatcher.
func (d *drainConn) dispatch(ch *Channel, job queuedJob) {
	d.mu.Lock()
	disp := d.dispatchers[ch]
	if job.del != nil && (disp == nil || disp.idle()) {
		// Nothing of this channel waits to run before it: the delivery
		// goes straight to its consumer's inbox, which never waits for
		// the application, saving the hop through the dispatcher.
		d.mu.Unlock()
		ch.consumers.deliver(job.del.ConsumerTag, job.del)
		return
	}
	if disp == nil {
		disp = &chanDispatcher{d: d, ch: ch}
		disp.budget = d.budget
		disp.outer = &d.mu
		disp.work = &d.jobs
		disp.handleJob = disp.handle
		d.initOutbox(&disp.out, &ch.notifyM, &ch.noNotify)
		disp.out.outer = &d.mu
		disp.out.channel = ch.id
		disp.out.forget = ch.forgetListener
		// A closed channel's dispatcher goes once its queue and outbox
		// are both idle; if recovery reopens the channel, its frames
		// start a new one. Both run under d.mu, then their own lock.
		disp.retired = func() bool {
			if ch.IsClosed() && disp.out.idle() {
				delete(d.dispatchers, ch)
				return false
			}
			return true
		}
		disp.linger = dispatcherLinger
		disp.ended = d.genDead
		disp.out.retired = func() {
			if ch.IsClosed() && disp.idle() {
				delete(d.dispatchers, ch)
				disp.unpark() // to retire now, not after the linger
			}
		}
		d.dispatchers[ch] = disp
	}
	disp.pushJob(job)
	d.mu.Unlock()
}

// dispatcherLinger is how long a channel's dispatcher stays parked after
// its last job, for the channel's next frames: a burst every few
// milliseconds (deliveries, confirms) keeps one goroutine, and an idle
// channel costs none after this.
const dispatcherLinger = time.Second

// genDead returns the chan closed when the current generation ends, at
// which parked dispatchers retire.
func (d *drainConn) genDead() <-chan struct{} {
	if g := d.current(); g != nil {
		return g.dead
	}
	return nil
}

// initOutbox sets up an outbox of this connection, owned by the holder of
// lock and closed.
func (d *drainConn) initOutbox(o *outbox, lock *sync.RWMutex, closed *bool) {
	o.lock, o.closed = lock, closed
	o.budget, o.work = d.budget, &d.work
	o.closeWait = d.opts.CloseTimeout
	o.watch = d.watch
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

// Notification costs charged to the budget while a value waits in an outbox.
func confirmationCost(Confirmation) int64 { return frameCost }
func returnCost(r Return) int64           { return frameCost + int64(len(r.Body)) }
func boolCost(bool) int64                 { return frameCost }
func stringCost(s string) int64           { return frameCost + int64(len(s)) }
func blockingCost(b Blocking) int64       { return frameCost + int64(len(b.Reason)) }

// dispatchMessage is Channel.dispatch without its waits on users:
// notifications, the settling of DeferredConfirmations, the closing of a
// cancelled consumer's deliveries and the channel's close go through the
// outbox, in arrival order; deliveries are charged to the budget; RPC
// replies reach their caller at once (they are not notifications, and an
// unread listener must not hold up the channel's RPCs); flow-ok and
// cancel-ok are written at once, as the protocol replies they are.
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
		ch.notifyM.RLock()
		ls := ch.returns
		ch.notifyM.RUnlock()
		notifyAllInOrder(out, ls, returnCost, *newReturn(*m))

	case *channelFlow:
		ch.notifyM.RLock()
		ls := ch.flows
		ch.notifyM.RUnlock()
		notifyAllInOrder(out, ls, boolCost, m.Active)
		if err := ch.send(&channelFlowOk{Active: m.Active}); err != nil {
			Logger.Printf("error sending channelFlowOk, channel id: %d error: %+v", ch.id, err)
		}

	case *basicCancel:
		disp.cancelled(m.ConsumerTag)

	case *basicDeliver:
		ch.consumers.deliver(m.ConsumerTag, newDelivery(ch, m))

	case *channelClose, *channelCloseOk:
		// The broker's close, or the close-ok that ends Channel.Close:
		// either way the listeners are closed next, so this waits for
		// the notifications before it (for closeWait at most).
		out.closeInOrder(func() { ch.dispatch(msg) })

	default:
		ch.dispatch(msg)
	}
}

// cancelled is the broker's basic.cancel of tag: NotifyCancel hears of it,
// then the consumer's deliveries chan closes, as upstream's order has it,
// and cancel-ok goes out at once.
func (disp *chanDispatcher) cancelled(tag string) {
	ch, out := disp.ch, &disp.out
	queueName, _ := ch.consumers.queueForTag(tag)
	ch.notifyM.RLock()
	ls := ch.cancels
	ch.notifyM.RUnlock()
	notifyAllInOrder(out, ls, stringCost, tag)
	if in := ch.consumers.inboundChan(tag); in != nil {
		out.inOrder(func() { ch.consumers.cancelFedBy(tag, in) })
	}
	if ch.connection.isCapable(serverCapabilityAcceptConsumerCancelOk) {
		// Serialised with publishes on this channel, as upstream.
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

// confirm settles publisher confirmations as upstream's confirms.One and
// confirms.Multiple do: DeferredConfirmations resolve, and listeners
// receive every confirmation in delivery-tag order (out-of-order acks are
// held back until the gap fills), both after the notifications that came
// before (a basic.return of the same message, say). Unlike upstream,
// nothing waits for a listener and nothing is dropped: when the outbox is
// busy, the settlement and the ordered batch queue there.
func (d *drainConn) confirm(ch *Channel, out *outbox, conf Confirmation, multiple bool) {
	cf := ch.confirms
	cf.m.Lock()
	var settle *settlement
	switch {
	case !out.idle():
		// Settled in order by the outbox. They leave the set now, so
		// that upstream's reset and Close, which nack what is left in
		// it, can never settle them twice. Every tag before expecting
		// is settled already, and none after published exists: take
		// looks only between them.
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

// sequence returns the confirmations that conf, a confirm of one tag or of
// every tag up to it, releases to ch's listeners in delivery-tag order:
// out-of-order acks are held back (sequencer) until the gap fills. The
// caller holds ch.confirms.m.
func sequence(ch *Channel, conf Confirmation, multiple bool) []Confirmation {
	cf := ch.confirms
	var ordered []Confirmation
	next := func(c Confirmation) {
		delete(cf.sequencer, cf.expecting)
		cf.expecting++
		ordered = append(ordered, c)
	}
	// A confirm of a tag never published breaks the protocol. Upstream
	// settles every tag up to it, one at a time; here only published tags
	// are settled, so a bogus tag (2^40, say: found by FuzzConnection)
	// costs neither a loop nor a slice that large.
	cf.publishedMut.Lock()
	published := cf.published
	cf.publishedMut.Unlock()
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

// notifyBlocked hands connection.blocked/unblocked to the NotifyBlocked
// listeners, in order, through the connection's outbox.
func (d *drainConn) notifyBlocked(ls []chan Blocking, b Blocking) {
	notifyAllInOrder(&d.connOut, ls, blockingCost, b)
}
