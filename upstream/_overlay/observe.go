// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"time"
)

// Observer is a set of hooks the drainer and legacy read paths call from their fast paths (upstream
// mode calls none). A nil field costs a nil check, so without an Observer the fast paths keep their
// allocations (0 per publish, 1 per delivery); hooks get what the read path holds, so calling them
// allocates nothing. Hooks run on the goroutine doing the work: they must be quick, must not block
// or call back into the connection, nor keep or modify what they get beyond the call.
type Observer struct {
	// BeforePublish runs before encoding, with the ctx of PublishWithContext, PublishBatch (once a
	// message) or PublishWithDeferredConfirmWithContext (the older methods are not observed). msg is
	// a copy valid during the call: it may set msg.Headers to a new Table (trace context) but not
	// modify the caller's. Its result (ctx is fine) goes to Published.
	BeforePublish func(ctx context.Context, info PublishInfo, msg *Publishing) context.Context
	// Published runs once the publish was written (err nil) or failed, with BeforePublish's
	// ctx (the publish's own without BeforePublish).
	Published func(ctx context.Context, info PublishInfo, err error)
	// Confirmed runs as confirms arrive, once per tag in order. Only publishes BeforePublish
	// would see are timed; a multiple confirm reports those, not any sent before an untimed one.
	Confirmed func(ConfirmInfo)
	// Returned runs for every basic.return, as it arrives.
	Returned func(*Return)
	// Delivered runs per basic.deliver (not basic.get-ok), in order, before the delivery
	// waits for the application.
	Delivered func(*Delivery)
	// Handled runs when a ConsumeFunc handler returned, with how long it took.
	Handled func(d *Delivery, took time.Duration, err error)
	// Settled runs once an application basic.ack, nack or reject is written (a
	// failed write ends the connection). Read off the frames, its DeliveryTag is
	// the broker's: after a recovery, the application's less its offset (recoverytags.go).
	// It runs inside the socket write, mostly under the connection's write lock, so it
	// must not write to the connection: that would deadlock.
	Settled func(SettleInfo)
	// SettleRefused runs when Ack, Nack or Reject refuses a tag and sends
	// nothing: err wraps ErrStaleDelivery (delivered before its channel
	// recovered) or ErrUnknownDeliveryTag. Its DeliveryTag is the application's.
	SettleRefused func(info SettleInfo, err error)
	// RPC runs when a synchronous method (the handshake's too) has its reply, or failed.
	RPC func(RPCInfo)
	// BudgetPaused runs when the drainer stops reading for a full budget, BudgetResumed when
	// it reads again.
	BudgetPaused, BudgetResumed func(BudgetInfo)
	// ListenerDropped runs when the stall policy (DrainerOptions.DropStalledListener) closed
	// a listener.
	ListenerDropped func(ListenerStats)
	// Connection runs when a generation opened (also by recovery or Reconnect), and at the
	// end.
	Connection func(ConnectionEvent)
	// Refreshed runs after each refresh of expiring credentials (ExpiringAuth), on the
	// refresh's own goroutine.
	Refreshed func(RefreshInfo)
}

// PublishInfo describes one publish to BeforePublish and Published.
type PublishInfo struct {
	Channel              uint16
	Exchange, RoutingKey string
	Mandatory            bool
	DeliveryTag          uint64 // its delivery tag in confirm mode (set for Published), else 0
	BodySize             int
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

// String returns "ack", "nack", "reject" or "unknown".
func (k SettleKind) String() string { return kindName(k, "ack", "nack", "reject") }

// kindName is names[k-1] for the kinds numbered from 1, else "unknown".
func kindName[K ~uint8](k K, names ...string) string {
	if k < 1 || int(k) > len(names) {
		return "unknown"
	}
	return names[k-1]
}

// SettleInfo describes one Ack, Nack or Reject.
type SettleInfo struct {
	Kind              SettleKind
	Channel           uint16
	DeliveryTag       uint64
	Multiple, Requeue bool
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
	Limit, Used int64         // the budget, and the bytes waiting for users
	Paused      time.Duration // for BudgetResumed: how long reading paused
	Holder      ListenerStats // the budget's biggest holder when the pause began
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

// String returns "opened", "recovered", "closed", "failed" or "unknown".
func (k ConnectionEventKind) String() string {
	return kindName(k, "opened", "recovered", "closed", "failed")
}

// ConnectionEvent describes a change in a connection's life.
type ConnectionEvent struct {
	Kind ConnectionEventKind
	Mode string // the read mode
	Err  error  // for ConnectionFailed: the error that ended it
}

// RefreshInfo describes one refresh of expiring credentials.
type RefreshInfo struct {
	Expires time.Time     // the new secret's expiry, or after a failure the installed one's
	Took    time.Duration // from asking the provider to the broker's update-secret-ok
	Err     error         // nil: installed; else wraps the provider's error or the broker's
}
