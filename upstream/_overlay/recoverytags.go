// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Tags across recoveries.
//
// The broker numbers a channel's deliveries from 1, and numbers them from 1
// again on the channel that automatic recovery reopens with the same id.
// Upstream hands the broker's tags to the application as they are, so the
// tag of a delivery received before a recovery names another message after
// it: acking it acks a message the application has not processed, and the
// application's own ack of that message later closes the channel
// (PRECONDITION_FAILED, unknown delivery tag). Publisher confirms restart
// at 1 as well.
//
// With unique tags (always on a connection with a read path, and in
// upstream mode with Config.SafeRecovery), the tags a Channel hands
// out keep growing across its generations, as the Java client's do: a
// generation's tags are the broker's plus the generation's offset, the
// highest tag handed out before it. Channel.Ack, Nack and Reject, which
// Delivery's methods call, translate a tag of the current generation back
// to the broker's, and refuse a tag of an earlier generation with
// ErrStaleDelivery, sending nothing. multiple=true therefore never reaches
// across a generation: the broker only knows the current one. A tag above
// every tag handed out is refused with ErrUnknownDeliveryTag, where the
// broker would close the channel. Until the first recovery, the tags are
// the broker's.
//
// A DeferredConfirmation still pending when its channel recovers ends
// unconfirmed (upstream nacks it), and with unique tags WaitContext and Err
// also say why: ErrStaleConfirmation. The new generation's confirms
// restart at 1 and are never matched to it.

// ErrStaleDelivery is wrapped by the error of an Ack, Nack or Reject of a
// delivery received before its channel recovered: the broker numbers the
// recovered channel's deliveries afresh, and the message it was is
// redelivered there (with Redelivered set) unless it was already settled.
// Nothing is sent. It wraps ErrClosed, as the delivery's channel is gone:
// errors.Is(err, ErrClosed) holds, as it does for an Ack after Close.
var ErrStaleDelivery error = &closedBecause{"amqp: delivery received before its channel recovered"}

// ErrUnknownDeliveryTag is wrapped by the error of an Ack, Nack or Reject
// of a tag above every tag its channel has handed out, with unique tags.
// Nothing is sent, and the channel stays open (the broker would close it
// with PRECONDITION_FAILED).
var ErrUnknownDeliveryTag = errors.New("amqp: unknown delivery tag")

// ErrStaleConfirmation is what DeferredConfirmation.WaitContext and Err
// return, with unique tags, for a publish whose channel recovered before
// the broker confirmed it. The broker may or may not have the message:
// publish it again if it must arrive (failover.Publisher does). It wraps
// ErrClosed.
var ErrStaleConfirmation error = &closedBecause{"amqp: publish not confirmed before its channel recovered"}

// ErrChannelRecovering is wrapped by the error of a publish made, with
// unique tags, while automatic recovery reopens its channel: from the
// reset that ends the pending confirmations (ErrStaleConfirmation) until
// the channel is back in StateOpen. Upstream sends such a publish: between
// channel.open and confirm.select-ok the client counts it and the broker
// does not, so every later confirmation is matched to the publish before
// its own and the last never comes; before channel.open, or between the
// frames of recovery's calls, the broker closes the connection. Nothing
// is sent. Publish again once NotifyStateChange reports StateOpen, as
// upstream's reconnectChannel documents. It wraps ErrClosed.
var ErrChannelRecovering error = &closedBecause{"amqp: channel is being recovered, publish once it is open again"}

// closedBecause is an error that wraps ErrClosed (errors.Is and errors.As
// find it) without repeating ErrClosed's text in its own.
type closedBecause struct{ text string }

// Error returns the text alone; Unwrap makes it ErrClosed.
func (e *closedBecause) Error() string { return e.text }
func (e *closedBecause) Unwrap() error { return ErrClosed }

// deliveryTags is a Channel's state for unique tags.
type deliveryTags struct {
	offset  atomic.Uint64 // the highest tag handed out before this generation
	highest atomic.Uint64 // the highest tag handed out, this generation's included
}

// recoveryState is a connection's state for safe recovery: its refused
// settlements, for Stats, and the secret of the last UpdateSecret, for
// the logins of later recoveries (credentials.go).
type recoveryState struct {
	stale, unknown atomic.Uint64
	secret         atomic.Pointer[string]
}

// safeRecovery says whether the connection's channels keep their tags
// unique across recoveries, and its recoveries log in with the secret of
// the last UpdateSecret: always with a read path, and in upstream mode
// with Config.SafeRecovery.
func (c *Connection) safeRecovery() bool {
	return c.rp != nil || c.Config.SafeRecovery
}

// handOut returns the application's tag for the broker's tag raw of this
// generation, and records it as handed out.
func (t *deliveryTags) handOut(raw uint64) uint64 {
	tag := raw + t.offset.Load()
	for {
		h := t.highest.Load()
		if tag <= h || t.highest.CompareAndSwap(h, tag) {
			return tag
		}
	}
}

// tagged gives d, which newDelivery has just decoded from a basic.deliver
// or basic.get-ok, the tag the application sees.
func (ch *Channel) tagged(d *Delivery) *Delivery {
	if ch != nil && ch.connection != nil && ch.connection.safeRecovery() {
		d.DeliveryTag = ch.tags.handOut(d.DeliveryTag)
	}
	return d
}

// nextGeneration starts the channel's next generation: Channel.resetState
// calls it, holding ch.m, before the channel is reopened. Every tag handed
// out so far becomes stale, and the pending DeferredConfirmations end with
// ErrStaleConfirmation (upstream's reset, which follows, ends them
// unconfirmed too, but says nothing of why).
func (ch *Channel) nextGeneration() {
	ch.tags.offset.Store(ch.tags.highest.Load())
	if ch.confirms == nil || !ch.connection.safeRecovery() {
		return
	}
	d := ch.confirms.deferredConfirmations
	d.m.Lock()
	defer d.m.Unlock()
	for tag, dc := range d.confirmations {
		dc.err = ErrStaleConfirmation
		dc.setAck(false)
		delete(d.confirmations, tag)
	}
}

// sendRecoverySafe is Channel.send's sendOpen, with the tag of a
// basic.ack, basic.nack or basic.reject, sent by Channel.Ack, Nack or
// Reject under ch.m, translated to the broker's (or refused) first, and a
// basic.publish refused while recovery reopens the channel.
func (ch *Channel) sendRecoverySafe(msg message) error {
	if ch.connection.safeRecovery() {
		if _, ok := msg.(*basicPublish); ok {
			if err := ch.midRecovery(); err != nil {
				return err
			}
		}
		if err := ch.settleTag(msg); err != nil {
			return err
		}
	}
	return ch.sendOpen(msg)
}

// midRecovery refuses a publish with ErrChannelRecovering while automatic
// recovery reopens ch. The channel is in StateReconnecting from before
// the reset until channel.open, basic.qos and confirm.select are done;
// recovery itself never publishes. It is only asked with unique tags
// (safeRecovery): sendRecoverySafe, and publish.go's publishRefused (a
// read path).
func (ch *Channel) midRecovery() error {
	if ch.connection.Config.Recovery == nil || ch.lifeCycle.State() != StateReconnecting {
		return nil
	}
	return fmt.Errorf("publish on channel %d: %w", ch.id, ErrChannelRecovering)
}

// settleTag translates the tag of a settlement in msg to the broker's tag
// of this generation, or refuses it, counting and reporting the refusal.
// Other methods pass unchanged.
func (ch *Channel) settleTag(msg message) error {
	info := SettleInfo{Channel: ch.id}
	var tag *uint64
	switch m := msg.(type) {
	case *basicAck:
		info.Kind, info.Multiple, tag = SettleAck, m.Multiple, &m.DeliveryTag
	case *basicNack:
		info.Kind, info.Multiple, info.Requeue, tag = SettleNack, m.Multiple, m.Requeue, &m.DeliveryTag
	case *basicReject:
		info.Kind, info.Requeue, tag = SettleReject, m.Requeue, &m.DeliveryTag
	default:
		return nil
	}
	// Tag 0 with multiple set means everything outstanding on the channel,
	// which is this generation's only: the broker knows no other.
	if *tag == 0 {
		return nil
	}
	info.DeliveryTag = *tag
	offset := ch.tags.offset.Load()
	var err error
	switch {
	case *tag <= offset:
		ch.connection.recovery.stale.Add(1)
		err = fmt.Errorf("%s of delivery tag %d on channel %d: %w; this generation's tags start at %d",
			info.Kind, *tag, ch.id, ErrStaleDelivery, offset+1)
	case *tag > ch.tags.highest.Load():
		ch.connection.recovery.unknown.Add(1)
		err = fmt.Errorf("%s of delivery tag %d on channel %d: %w; the highest it handed out is %d",
			info.Kind, *tag, ch.id, ErrUnknownDeliveryTag, ch.tags.highest.Load())
	default:
		*tag -= offset
		return nil
	}
	if o := ch.connection.obsOf(); o != nil && o.SettleRefused != nil {
		o.SettleRefused(info, err)
	}
	return err
}

// Err returns why the confirmation ended without the broker's ack or nack:
// ErrStaleConfirmation when its channel recovered first (with unique tags:
// a read path, or Config.SafeRecovery). It returns nil while the
// confirmation is pending, and once the broker acked or nacked it.
func (d *DeferredConfirmation) Err() error {
	select {
	case <-d.done:
		return d.err
	default:
		return nil
	}
}
