// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// ErrStaleDelivery is wrapped by the error of an Ack, Nack or Reject of a delivery received before
// its channel recovered (the broker redelivers it). Nothing is sent. It wraps ErrClosed.
var ErrStaleDelivery error = &closedBecause{
	"amqp: delivery received before its channel recovered"}

// ErrUnknownDeliveryTag is wrapped by the error of an Ack, Nack or Reject,
// with unique tags, of a tag above every tag its channel handed out.
// Nothing is sent; the channel stays open (the broker would close it).
// It does not wrap ErrClosed: the channel is not closed.
var ErrUnknownDeliveryTag = errors.New("amqp: unknown delivery tag")

// ErrStaleConfirmation is what DeferredConfirmation.WaitContext and Err return, with unique tags,
// when the channel recovered before the confirm. The broker may or may not have the message:
// publish it again if it must arrive (failover.Publisher does). It wraps ErrClosed.
var ErrStaleConfirmation error = &closedBecause{
	"amqp: publish not confirmed before its channel recovered"}

// ErrChannelRecovering is wrapped by the error of a publish made, with unique tags, while recovery
// reopens its channel; nothing is sent (the broker would close the connection or mismatch later
// confirms). Publish again once NotifyStateChange reports StateOpen. It wraps ErrClosed.
var ErrChannelRecovering error = &closedBecause{
	"amqp: channel is being recovered, publish once it is open again"}

// closedBecause wraps ErrClosed without repeating its text, so that code written for
// upstream, which checks errors.Is(err, ErrClosed), treats these refusals as a closed channel.
type closedBecause struct{ text string }

// Error returns the refusal's own text.
func (e *closedBecause) Error() string { return e.text }

// Unwrap makes errors.Is(err, ErrClosed) true.
func (e *closedBecause) Unwrap() error { return ErrClosed }

// deliveryTags gives a Channel's deliveries a recovery generation (#27). The broker numbers a
// channel's deliveries from 1 each time the channel opens, and recovery reopens the same
// Channel: without a generation, tag 5 before a recovery and tag 5 after it are the same
// number for two different messages. An Ack of the old tag 5, made late by an application
// that did not see the recovery, would then settle the new message 5, which was never
// processed, while the old one is redelivered anyway (its channel closed unsettled); an old
// tag above the new generation's count closes the channel with PRECONDITION_FAILED.
//
// What it guarantees, with unique tags (safeRecovery): the tags a Channel hands out grow
// across its whole life; a tag is the broker's plus offset, the highest tag handed out before
// the current generation. A settlement of a tag at or below offset is stale and refused
// unsent (ErrStaleDelivery), one above highest is unknown and refused (ErrUnknownDeliveryTag),
// and any other goes out as the broker's tag (tag - offset). So a multiple=true settlement
// never reaches back into an earlier generation.
//
// Which lock carries it: offset moves only in nextGeneration, called by upstream's resetState
// under ch.m before the reopen's channel.open, so no delivery of the new generation is
// decoded before it moves; settlements translate in settleTag, under the ch.m that Ack, Nack
// and Reject hold, so a settlement sees a generation's offset whole. highest is raised by
// whoever decodes a delivery, without ch.m, with a compare-and-swap: it only grows. Both are
// atomics because decoding, on the reading side, takes no channel lock.
type deliveryTags struct {
	offset  atomic.Uint64 // the highest tag handed out before this generation
	highest atomic.Uint64 // the highest tag handed out, this generation's included
}

// recoveryState is a connection's recovery bookkeeping: the refused settlements, counted
// for Stats, and the last UpdateSecret's secret, which later logins send (credentials.go).
type recoveryState struct {
	stale, unknown atomic.Uint64
	secret         atomic.Pointer[string]
}

// safeRecovery says whether tags stay unique and logins take UpdateSecret's secret: always
// with a read path, and in upstream mode with Config.SafeRecovery (upstream's behaviour
// stays the default there).
func (c *Connection) safeRecovery() bool { return c.rp != nil || c.Config.SafeRecovery }

// handOut returns and records the application's tag for the broker's tag raw: raw plus the
// generation's offset, raising highest to it unless a later tag is there already. The
// compare-and-swap loop keeps highest the maximum when two goroutines decode at once (a
// basic.get-ok beside a delivery, say): a plain store could lower it.
func (t *deliveryTags) handOut(raw uint64) uint64 {
	tag := raw + t.offset.Load()
	for {
		h := t.highest.Load()
		if tag <= h || t.highest.CompareAndSwap(h, tag) {
			return tag
		}
	}
}

// tagged gives d, just decoded by newDelivery, the application's tag; without unique tags
// (upstream mode without SafeRecovery) d keeps the broker's, as upstream.
func (ch *Channel) tagged(d *Delivery) *Delivery {
	if ch != nil && ch.connection != nil && ch.connection.safeRecovery() {
		d.DeliveryTag = ch.tags.handOut(d.DeliveryTag)
	}
	return d
}

// nextGeneration makes all tags and pending confirmations stale; ch.m held. A pending
// confirmation ends with ErrStaleConfirmation: the broker that would have confirmed it is
// gone with the old channel, and the new channel numbers its confirms from 1 again.
func (ch *Channel) nextGeneration() {
	ch.tags.offset.Store(ch.tags.highest.Load())
	if ch.confirms == nil || !ch.connection.safeRecovery() {
		return
	}
	// Each pending confirmation ends now, nacked with err set before done closes (setAck), so
	// its waiters return; it leaves the map, where the new generation's tag 1 starts anew.
	d := ch.confirms.deferredConfirmations
	d.m.Lock()
	defer d.m.Unlock()
	for tag, dc := range d.confirmations {
		dc.err = ErrStaleConfirmation
		dc.setAck(false)
		delete(d.confirmations, tag)
	}
}

// sendRecoverySafe is the hook in upstream's Channel.send for an open channel: with unique
// tags, a publish is refused while recovery reopens the channel (midRecovery) and a
// settlement's tag translated or refused (settleTag); then sendGrouped sends it. ch.m is held
// by the senders that matter here (the publish paths, Ack, Nack, Reject).
func (ch *Channel) sendRecoverySafe(msg message) error {
	// Publishes and settlements only: settleTag passes any other method unchanged.
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

// midRecovery refuses a publish while recovery reopens ch (unique tags only): sent inside
// the reopen's handshake it would close the connection or put later confirms out of step.
func (ch *Channel) midRecovery() error {
	if ch.connection.Config.Recovery == nil || ch.lifeCycle.State() != StateReconnecting {
		return nil
	}
	return fmt.Errorf("publish on channel %d: %w", ch.id, ErrChannelRecovering)
}

// settleTag translates a settlement's tag to the broker's, or refuses it (see deliveryTags);
// ch.m is held. A refusal is counted for Stats and reported to Observer.SettleRefused.
func (ch *Channel) settleTag(msg message) error {
	// info describes the settlement with the application's tag, for SettleRefused; tag
	// points into msg, so the translation below changes what is sent.
	info := SettleInfo{Channel: ch.id}
	var tag *uint64
	switch m := msg.(type) {
	case *basicAck:
		info.Kind = SettleAck
		info.Multiple = m.Multiple
		tag = &m.DeliveryTag
	case *basicNack:
		info.Kind = SettleNack
		info.Multiple = m.Multiple
		info.Requeue = m.Requeue
		tag = &m.DeliveryTag
	case *basicReject:
		info.Kind = SettleReject
		info.Requeue = m.Requeue
		tag = &m.DeliveryTag
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
		err = fmt.Errorf("%s of delivery tag %d on channel %d: %w; "+
			"this generation's tags start at %d", info.Kind, *tag, ch.id, ErrStaleDelivery, offset+1)
	case *tag > ch.tags.highest.Load():
		ch.connection.recovery.unknown.Add(1)
		err = fmt.Errorf("%s of delivery tag %d on channel %d: %w; the highest it handed out is %d",
			info.Kind, *tag, ch.id, ErrUnknownDeliveryTag, ch.tags.highest.Load())
	default:
		*tag -= offset // the broker's tag: the message goes out with it
		return nil
	}
	if o := ch.connection.obsOf(); o != nil && o.SettleRefused != nil {
		o.SettleRefused(info, err)
	}
	return err
}

// Err is ErrStaleConfirmation if its channel recovered before the confirm (unique tags), else
// nil. It is nil until the confirmation is done: nextGeneration sets the error before done
// closes, and only then.
func (d *DeferredConfirmation) Err() error {
	if isClosing(d.done) {
		return d.err
	}
	return nil
}
