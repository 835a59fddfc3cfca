// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"time"
)

// Observer hooks.
//
// An Observer is a set of funcs that the drainer and legacy read paths call
// from their fast paths: the publish path, the dispatch of confirms and
// deliveries, ConsumeFunc, the acknowledgements, the RPC waits, the budget
// and the connection's life. Every field may be nil; a nil field costs one
// nil check, so a connection without an Observer keeps the fast paths'
// allocations (0 per publish, 2 per delivery). The funcs receive values or
// pointers to what the read path already holds, so calling them allocates
// nothing either.
//
// The funcs run on the goroutine that does the work (the publisher, the
// channel's dispatcher, the reader): they must be quick, must not block and
// must not call back into the connection. They must not keep or modify the
// pointers they receive beyond the call, except where a field's comment
// says otherwise.
//
// Upstream mode (no read path) calls no Observer: its code paths stay
// upstream's.
type Observer struct {
	// BeforePublish runs before a message is encoded, with the ctx of
	// PublishWithContext or PublishWithDeferredConfirmWithContext (the
	// fast path; the older Publish and PublishWithDeferredConfirm run
	// upstream's code and are not observed). msg is a copy of the
	// caller's Publishing, valid during the call only: BeforePublish may
	// set msg.Headers to a new Table (to inject trace context, say), but
	// must not modify the caller's Table in place: copy it. The context it
	// returns is passed to Published; returning ctx is fine.
	BeforePublish func(ctx context.Context, info PublishInfo, msg *Publishing) context.Context

	// Published runs once the message is written (err nil) or failed
	// (err is what the publish returns), with BeforePublish's context.
	// info.DeliveryTag is set in confirm mode.
	Published func(ctx context.Context, info PublishInfo, err error)

	// Confirmed runs for every publish the broker confirms, one call per
	// delivery tag even when the broker acks several at once, in tag
	// order, as the confirm arrives. Only the fast path's publishes (see
	// BeforePublish) are timed, and a confirm of several tags reports the
	// timed ones only: a channel that also uses the older methods gets no
	// report for those, nor for the timed tags before one of them.
	Confirmed func(ConfirmInfo)

	// Returned runs for every basic.return, as it arrives.
	Returned func(*Return)

	// Delivered runs for every delivery to a consumer (basic.deliver) as
	// it is handed to its consumer, in order after its channel's earlier
	// frames, before it waits for the application. Get's basic.get-ok is
	// not reported.
	Delivered func(*Delivery)

	// Handled runs when a ConsumeFunc handler returns, with its error and
	// how long it ran.
	Handled func(d *Delivery, took time.Duration, err error)

	// Settled runs when a basic.ack, basic.nack or basic.reject of the
	// application (Channel.Ack, Nack, Reject, Delivery's methods) has
	// been written to the socket. It is read off the written frames, so
	// upstream's Channel needs no hook; a write that fails ends the
	// connection instead, and the caller gets the error. Its DeliveryTag
	// is therefore the broker's, as written: after a recovery, the
	// application's tag less its generation's offset (recoverytags.go).
	Settled func(SettleInfo)
	// SettleRefused runs when Channel.Ack, Nack or Reject refuses a tag
	// and sends nothing (recoverytags.go): err wraps ErrStaleDelivery for
	// a delivery received before its channel recovered, and
	// ErrUnknownDeliveryTag for a tag the channel never handed out. Its
	// DeliveryTag is the application's, as passed to Ack.
	SettleRefused func(info SettleInfo, err error)

	// RPC runs when a synchronous method (QueueDeclare, Qos, Channel, the
	// handshake's connection methods, ...) has its reply or failed.
	RPC func(RPCInfo)

	// BudgetPaused runs when the drainer stops reading the socket because
	// the budget is full, and BudgetResumed when it reads again.
	BudgetPaused  func(BudgetInfo)
	BudgetResumed func(BudgetInfo)

	// ListenerDropped runs when the stall policy
	// (DrainerOptions.DropStalledListener) closed a listener.
	ListenerDropped func(ListenerStats)

	// Connection runs when a connection generation opens (the first one,
	// or one that automatic recovery or Reconnect opened), and when the
	// connection closes or fails.
	Connection func(ConnectionEvent)
}

// PublishInfo describes one publish to Observer.BeforePublish and
// Observer.Published.
type PublishInfo struct {
	Channel     uint16
	Exchange    string
	RoutingKey  string
	Mandatory   bool
	DeliveryTag uint64 // its delivery tag in confirm mode (set for Published), else 0
	BodySize    int
}

// ConfirmInfo describes one confirmed publish.
type ConfirmInfo struct {
	Channel     uint16
	DeliveryTag uint64
	Ack         bool          // false: the broker nacked it
	Latency     time.Duration // since the publish's write began; 0 if unknown
}

// SettleKind says how the application settled a delivery.
type SettleKind uint8

// The ways to settle a delivery.
const (
	SettleAck SettleKind = iota + 1
	SettleNack
	SettleReject
)

// String returns "ack", "nack" or "reject".
func (k SettleKind) String() string {
	switch k {
	case SettleAck:
		return "ack"
	case SettleNack:
		return "nack"
	case SettleReject:
		return "reject"
	}
	return "unknown"
}

// SettleInfo describes one Ack, Nack or Reject.
type SettleInfo struct {
	Kind        SettleKind
	Channel     uint16
	DeliveryTag uint64
	Multiple    bool
	Requeue     bool
}

// RPCInfo describes one synchronous method.
type RPCInfo struct {
	Channel uint16        // 0 for connection-level methods
	Method  string        // the request's method, as "queue.declare"
	Latency time.Duration // from the request's write to the reply
	Err     error
}

// BudgetInfo describes a pause or resume of the drainer's reading.
type BudgetInfo struct {
	Limit  int64         // the budget
	Used   int64         // bytes waiting for users
	Paused time.Duration // for BudgetResumed: how long reading paused
	// Holder is the biggest holder of the budget when the pause began.
	Holder ListenerStats
}

// ConnectionEventKind says what happened to a connection.
type ConnectionEventKind uint8

// The events of a connection's life.
const (
	ConnectionOpened    ConnectionEventKind = iota + 1 // the first generation completed its handshake
	ConnectionRecovered                                // a later generation (recovery, Reconnect) did
	ConnectionClosed                                   // closed by the application
	ConnectionFailed                                   // closed by the broker or by a failure
)

// String names the kind: "opened", "recovered", "closed", "failed".
func (k ConnectionEventKind) String() string {
	switch k {
	case ConnectionOpened:
		return "opened"
	case ConnectionRecovered:
		return "recovered"
	case ConnectionClosed:
		return "closed"
	case ConnectionFailed:
		return "failed"
	}
	return "unknown"
}

// ConnectionEvent describes a change in a connection's life.
type ConnectionEvent struct {
	Kind ConnectionEventKind
	Mode string // the read mode
	Err  error  // for ConnectionFailed: the error that ended it
}
