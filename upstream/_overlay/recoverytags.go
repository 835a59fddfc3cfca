// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// ErrStaleDelivery is wrapped by the error of an Ack, Nack or Reject of a delivery received before
// its channel recovered (the broker redelivers it). Nothing is sent. It wraps ErrClosed.
var ErrStaleDelivery error = &closedBecause{"amqp: delivery received before its channel recovered"}

// ErrUnknownDeliveryTag is wrapped by the error of an Ack, Nack or Reject,
// with unique tags, of a tag above every tag its channel handed out.
// Nothing is sent; the channel stays open (the broker would close it).
var ErrUnknownDeliveryTag = errors.New("amqp: unknown delivery tag")

// ErrStaleConfirmation is what DeferredConfirmation.WaitContext and Err return, with unique tags,
// when the channel recovered before the confirm. The broker may or may not have the message:
// publish it again if it must arrive (failover.Publisher does). It wraps ErrClosed.
var ErrStaleConfirmation error = &closedBecause{"amqp: publish not confirmed before its channel recovered"}

// ErrChannelRecovering is wrapped by the error of a publish made, with unique tags, while recovery
// reopens its channel; nothing is sent (the broker would close the connection or mismatch later
// confirms). Publish again once NotifyStateChange reports StateOpen. It wraps ErrClosed.
var ErrChannelRecovering error = &closedBecause{"amqp: channel is being recovered, publish once it is open again"}

// closedBecause wraps ErrClosed without repeating its text.
type closedBecause struct{ text string }

func (e *closedBecause) Error() string { return e.text }
func (e *closedBecause) Unwrap() error { return ErrClosed }

// deliveryTags keeps a Channel's tags unique across recoveries (#27), where the broker restarts
// at 1: a tag is the broker's plus offset; older ones are refused, so multiple=true stays in a generation.
type deliveryTags struct {
	offset  atomic.Uint64 // the highest tag handed out before this generation
	highest atomic.Uint64 // the highest tag handed out, this generation's included
}

// recoveryState holds refusals for Stats, and the secret for logins (credentials.go).
type recoveryState struct {
	stale, unknown atomic.Uint64
	secret         atomic.Pointer[string]
}

// safeRecovery says whether tags stay unique and logins take UpdateSecret's: a read path, or Config.SafeRecovery.
func (c *Connection) safeRecovery() bool { return c.rp != nil || c.Config.SafeRecovery }

// handOut returns and records the application's tag for raw.
func (t *deliveryTags) handOut(raw uint64) uint64 {
	tag := raw + t.offset.Load()
	for {
		h := t.highest.Load()
		if tag <= h || t.highest.CompareAndSwap(h, tag) {
			return tag
		}
	}
}

// tagged gives d, just decoded by newDelivery, the application's tag.
func (ch *Channel) tagged(d *Delivery) *Delivery {
	if ch != nil && ch.connection != nil && ch.connection.safeRecovery() {
		d.DeliveryTag = ch.tags.handOut(d.DeliveryTag)
	}
	return d
}

// nextGeneration makes all tags and pending confirmations stale; ch.m held.
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

// sendRecoverySafe is sendOpen (sendGrouped), after midRecovery and settleTag (under ch.m).
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
	return ch.sendGrouped(msg)
}

// midRecovery refuses a publish while recovery reopens ch (unique tags only).
func (ch *Channel) midRecovery() error {
	if ch.connection.Config.Recovery == nil || ch.lifeCycle.State() != StateReconnecting {
		return nil
	}
	return fmt.Errorf("publish on channel %d: %w", ch.id, ErrChannelRecovering)
}

// settleTag translates a settlement's tag to the broker's, or refuses it.
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
	if *tag == 0 { // with multiple: all outstanding, this generation's only
		return nil
	}
	info.DeliveryTag = *tag
	offset := ch.tags.offset.Load()
	var err error
	switch {
	case *tag <= offset:
		ch.connection.recovery.stale.Add(1)
		err = fmt.Errorf("%s of delivery tag %d on channel %d: %w; this generation's tags start at %d", info.Kind, *tag, ch.id, ErrStaleDelivery, offset+1)
	case *tag > ch.tags.highest.Load():
		ch.connection.recovery.unknown.Add(1)
		err = fmt.Errorf("%s of delivery tag %d on channel %d: %w; the highest it handed out is %d", info.Kind, *tag, ch.id, ErrUnknownDeliveryTag, ch.tags.highest.Load())
	default:
		*tag -= offset
		return nil
	}
	if o := ch.connection.obsOf(); o != nil && o.SettleRefused != nil {
		o.SettleRefused(info, err)
	}
	return err
}

// Err is ErrStaleConfirmation if its channel recovered before the confirm (unique tags), else nil.
func (d *DeferredConfirmation) Err() error {
	if isClosing(d.done) {
		return d.err
	}
	return nil
}
