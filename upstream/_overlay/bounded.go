// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Bounded calls.
//
// Upstream's synchronous methods wait for their reply as long as the broker
// takes. The context variants in bounded_methods.go run the very same
// upstream method, on a goroutine of their own, and wait for it or for
// their ctx, whichever comes first; nothing in upstream's code path
// changes, in any read mode. The goroutine is what makes the bound hold
// whatever the method is blocked in: the wait for the reply, the write of
// the request, or a lock a blocked publisher holds.
//
// A caller who leaves before the reply cannot be matched to it later:
// AMQP 0-9-1 replies carry no request id, and a channel has one RPC in
// flight. So the channel is abandoned, as the Java client does after its
// channelRpcTimeout:
//
//  1. The channel is marked closed, at once, so nothing more is sent on it.
//  2. Its id is handed to a stand-in channel (takeOver) that discards
//     every frame for it (the late reply, deliveries in flight) and keeps
//     the id reserved, so that no new channel can be given the id, nor the
//     late reply.
//  3. The channel is shut down as by Close: waiters get ErrClosed,
//     deliveries and listeners are closed, pending confirmations nacked.
//     Unacknowledged deliveries return to their queue when the broker
//     closes the channel.
//  4. The stand-in sends channel.close (retire) and waits for
//     channel.close-ok, then releases the id (closeInBackground). It waits
//     as long as the broker takes (the broker that did not answer may
//     still be blocked) or until the connection ends; it holds no lock
//     meanwhile, and it only waits: whoever reads the socket hands it the
//     close-ok. A stand-in whose connection ends is dropped with it, so
//     automatic recovery never reopens one.
//
// A connection-level request has no channel to give up, so abandoning one
// ends the connection (abandonConnection).

// ErrRPCTimeout is the cause of an *RPCError from a synchronous method that
// got no reply within DrainerOptions.RPCTimeout or LegacyOptions.RPCTimeout.
var ErrRPCTimeout = errors.New("amqp: no reply within the RPC timeout")

// RPCError is returned by a synchronous method whose reply did not come
// before its context ended (a ...WithContext method) or before the read
// mode's RPCTimeout. errors.Is(err, context.Cause(ctx)) holds for the
// first (that is ctx.Err() unless ctx was given a cause), errors.Is(err,
// ErrRPCTimeout) for the second. When the request had been
// handed to the connection, the channel (for a channel-level request) or
// the connection (for a connection-level one) is closed as a consequence,
// and errors.Is(err, ErrClosed) holds too: open a new channel to go on.
// Whether the broker carried out the request is then unknown, as with any
// request whose reply was lost: a declaration may exist, a message taken
// by a GetWithContext with autoAck may be gone.
type RPCError struct {
	// Method is the request, in the spec's dotted form ("queue.declare").
	Method string
	// Channel is the channel the request was sent on; 0 for the connection.
	Channel uint16
	// Err is context.Cause(ctx) or ErrRPCTimeout.
	Err error
	// Closed reports whether the channel or connection was closed because
	// the reply was given up on. It is false when the context had already
	// ended before anything was sent.
	Closed bool
}

// Error names the request and the cause, and says whether it was sent and
// what was closed.
func (e *RPCError) Error() string {
	on := "connection"
	if e.Channel != 0 {
		on = fmt.Sprintf("channel %d", e.Channel)
	}
	if !e.Closed {
		return fmt.Sprintf("amqp: %s on %s not sent: %v", e.Method, on, e.Err)
	}
	return fmt.Sprintf("amqp: %s on %s: no reply: %v (the %s is closed)", e.Method, on, e.Err, onKind(e.Channel))
}

// onKind names what an RPC on channel closes when it is given up.
func onKind(channel uint16) string {
	if channel == 0 {
		return "connection"
	}
	return "channel"
}

// Unwrap makes errors.Is match the cause, and ErrClosed once the channel
// or connection is closed.
func (e *RPCError) Unwrap() []error {
	if e.Closed {
		return []error{e.Err, ErrClosed}
	}
	return []error{e.Err}
}

// errNilContext is what a ...WithContext method returns for a nil ctx, as
// the standard library's context-taking functions refuse one.
var errNilContext = errors.New("amqp: nil Context")

// boundedRun is one synchronous call running on its own goroutine. It is
// pooled: a call that completes in time gives it back, an abandoned one
// leaves it to the goroutine and the collector.
type boundedRun struct {
	call func() error
	err  error
	done chan struct{} // buffered: run never waits for the caller
}

var boundedRuns = sync.Pool{New: func() any { return &boundedRun{done: make(chan struct{}, 1)} }}

func (r *boundedRun) run() {
	r.err = r.call()
	r.done <- struct{}{}
}

// finish returns the call's error and gives r back to the pool.
func (r *boundedRun) finish() error {
	err := r.err
	r.call, r.err = nil, nil
	boundedRuns.Put(r)
	return err
}

// runBounded runs call bounded by ctx. It returns call's error if call
// returns first. Otherwise it runs abandon, which must not block, with
// the chan that receives once call has returned, and returns the
// *RPCError for the caller. A ctx that has ended already runs nothing; one
// that cannot end (Done nil) runs call on the caller's goroutine: exactly
// the plain method.
func runBounded(ctx context.Context, method string, channel uint16, call func() error, abandon func(cause error, ended <-chan struct{})) error {
	if ctx == nil {
		return errNilContext
	}
	if ctx.Done() == nil {
		return call()
	}
	if ctx.Err() != nil {
		return &RPCError{Method: method, Channel: channel, Err: context.Cause(ctx)}
	}
	r := boundedRuns.Get().(*boundedRun)
	r.call = call
	go r.run()
	select {
	case <-r.done:
		return r.finish()
	case <-ctx.Done():
	}
	select {
	case <-r.done: // the reply and the end came together: the reply wins
		return r.finish()
	default:
	}
	cause := context.Cause(ctx)
	abandon(cause, r.done) // r is the goroutine's now: never back in the pool
	return &RPCError{Method: method, Channel: channel, Err: cause, Closed: true}
}

// bounded runs call, one of ch's synchronous methods, bounded by ctx, and
// abandons ch if ctx ends first.
func (ch *Channel) bounded(ctx context.Context, method string, call func() error) error {
	return runBounded(ctx, method, ch.id, call, func(_ error, ended <-chan struct{}) { ch.abandonAfter(method, ended) })
}

// abandon gives up ch after a caller left before the reply to method; see
// the top of this file. It returns at once; the rest runs on a goroutine.
// It does nothing when ch is closed or closing already, or was abandoned
// by another caller.
func (ch *Channel) abandon(method string) { ch.abandonAfter(method, nil) }

// abandonAfter is abandon for a call that may not have written its
// request yet: the call checks that ch is open, then waits for the write
// lock (in legacy mode, for a read to end), and a stand-in's channel.close
// written meanwhile would go out before the request, which the broker
// takes for a method on a closing channel. So the stand-in writes only
// once the call has returned (ended receives), which the shutdown of ch
// brings about at once after the call's write: its reply wait ends with
// the channel. A nil ended: the request is on the wire already.
func (ch *Channel) abandonAfter(method string, ended <-chan struct{}) {
	if stand := ch.takeOver(); stand != nil {
		go func() {
			err := ch.retire(stand, "abandoned "+method, ended)
			stand.closeInBackground(err)
		}()
	}
}

// takeOver hands ch's id to a new stand-in channel and marks ch closed, or
// returns nil when ch no longer holds its id.
func (ch *Channel) takeOver() *Channel {
	c := ch.connection
	c.m.Lock()
	defer c.m.Unlock()
	if ch.closeInit.Load() || ch.IsClosed() || c.channels[ch.id] != ch {
		return nil
	}
	ch.closeInit.Store(true) // no recovery brings it back
	ch.setClosed()           // nothing more is sent on it
	return c.standIn(ch.id)
}

// standIn registers and returns a stand-in for channel id; the caller
// holds c.m.
func (c *Connection) standIn(id uint16) *Channel {
	stand := newChannel(c, id)
	stand.closeInit.Store(true)
	c.channels[id] = stand
	return stand
}

// rpcTimedOut gives up the reply that a plain synchronous method on ch
// waited for longer than the read mode's RPCTimeout, and returns the
// method's error. For Close, whose channel.close is on the wire already,
// a stand-in only waits for the close-ok, so that the id Close releases
// is not reused before it.
func (ch *Channel) rpcTimedOut(res []message) error {
	name := requestFor(res)
	if name != "channel.close" {
		ch.abandon(name)
	} else if stand := ch.standInForClose(); stand != nil {
		go stand.closeInBackground(nil)
	}
	return &RPCError{Method: name, Channel: ch.id, Err: ErrRPCTimeout, Closed: true}
}

// standInForClose registers a stand-in for ch's id, or returns nil when ch
// no longer holds it.
func (ch *Channel) standInForClose() *Channel {
	c := ch.connection
	c.m.Lock()
	defer c.m.Unlock()
	if c.channels[ch.id] != ch {
		return nil
	}
	return c.standIn(ch.id)
}

// connTimedOut is rpcTimedOut for a request on channel 0: it ends the
// connection.
func (c *Connection) connTimedOut(res []message) error {
	name := requestFor(res)
	c.rp.abandon(&Error{Code: InternalError, Reason: name + " got no reply within the RPC timeout", Recover: true})
	return &RPCError{Method: name, Err: ErrRPCTimeout, Closed: true}
}

// closeStarted reports whether Close (or the library's own close) has
// begun: its close-ok wait is bounded by CloseTimeout, not RPCTimeout.
func (c *Connection) closeStarted() bool {
	c.closeM.Lock()
	defer c.closeM.Unlock()
	return c.closeInit
}

// retire shuts ch down as Close does (it may wait for a publish in
// progress to let go of ch.m), then sends channel.close for its id through
// stand, once the abandoned call has returned if ended is not nil, and
// returns the send's error.
func (ch *Channel) retire(stand *Channel, reason string, ended <-chan struct{}) error {
	c := ch.connection
	ch.closeRecovery()
	ch.lifeCycle.SetState(StateClosing, nil)
	c.closeChannel(ch, nil) // ch no longer holds its id: this only shuts ch down

	send := func() error {
		if ended != nil {
			<-ended // its request, if it was being written, goes first
		}
		return stand.send(&channelClose{ReplyCode: replySuccess, ReplyText: reason})
	}
	if c.rp != nil {
		return c.rp.standInSend(send)
	}
	return send()
}

// closeInBackground waits, on the calling goroutine, for the close-ok to
// a stand-in's channel.close (unless sendErr says it was not sent), then
// releases its id.
func (stand *Channel) closeInBackground(sendErr error) {
	if sendErr == nil {
		_ = stand.awaitCloseOk(context.Background(), false)
	}
	stand.connection.dropStandIn(stand)
}

// awaitCloseOk waits for channel.close-ok on a stand-in, dropping the
// replies that were meant for the caller who left, until ctx ends. With
// pump false it only waits: whoever reads the socket hands the frames over
// (in legacy mode, the application's drain loop or its next call), so a
// stand-in whose caller left never becomes a reader of its own. With pump
// set, the caller reads frames meanwhile if the read mode needs it to
// (legacy), as a waiting Close does.
func (ch *Channel) awaitCloseOk(ctx context.Context, pump bool) error {
	ch.m.Lock()
	errs, rpc := ch.errors, ch.rpc
	ch.m.Unlock()
	next := waitReply
	if rp := ch.connection.rp; pump && rp != nil {
		next = rp.nextReply
	}
	for {
		msg, err := next(ctx, errs, rpc)
		if err != nil {
			return err
		}
		if _, ok := msg.(*channelCloseOk); ok {
			return nil
		}
	}
}

// dropStandIn releases a stand-in's id, unless the broker's channel.close
// released it already, and shuts it down. It also runs while the
// connection is closed (upstream's releaseChannel does not), so that
// recovery never tries to reopen a stand-in.
func (c *Connection) dropStandIn(stand *Channel) {
	c.m.Lock()
	if got, ok := c.channels[stand.id]; ok && got == stand {
		delete(c.channels, stand.id)
		c.allocator.release(int(stand.id))
		c.removeChannelTopology(stand.id)
	}
	c.m.Unlock()
	stand.shutdown(nil)
}

// await is the waiting half of upstream's Channel.call: it waits for the
// next reply on ch and matches it into one of res, through the read
// path's hook when there is one.
func (ch *Channel) await(res ...message) error {
	ch.m.Lock()
	errs, rpc := ch.errors, ch.rpc
	ch.m.Unlock()
	if rp := ch.connection.rp; rp != nil {
		return rp.chanCall(ch, errs, rpc, res)
	}
	msg, err := waitReply(context.Background(), errs, rpc)
	if err != nil {
		return err
	}
	return matchReply(msg, res)
}

// abandonConnection ends c after a connection-level request got no reply
// in time: a reply that came later could not be told from the next one.
// It returns at once.
func (c *Connection) abandonConnection(method string, cause error) {
	err := &Error{Code: InternalError, Reason: fmt.Sprintf("%s got no reply: %v", method, cause), Recover: true}
	if c.rp != nil {
		c.rp.abandon(err)
		return
	}
	go c.shutdown(err)
}

// channelRequests names the synchronous requests by the reply they wait
// for, for the RPC timeout's error, which sees only the replies.
var channelRequests = map[[2]uint16]string{
	{10, 10}: "protocol header", {10, 20}: "connection.start-ok", {10, 30}: "connection.start-ok", {10, 41}: "connection.open",
	{10, 51}: "connection.close", {10, 71}: "connection.update-secret",
	{20, 11}: "channel.open", {20, 21}: "channel.flow", {20, 41}: "channel.close",
	{40, 11}: "exchange.declare", {40, 21}: "exchange.delete", {40, 31}: "exchange.bind", {40, 51}: "exchange.unbind",
	{50, 11}: "queue.declare", {50, 21}: "queue.bind", {50, 31}: "queue.purge", {50, 41}: "queue.delete", {50, 51}: "queue.unbind",
	{60, 11}: "basic.qos", {60, 21}: "basic.consume", {60, 31}: "basic.cancel", {60, 71}: "basic.get", {60, 72}: "basic.get",
	{60, 111}: "basic.recover",
	{85, 11}:  "confirm.select",
	{90, 11}:  "tx.select", {90, 21}: "tx.commit", {90, 31}: "tx.rollback",
}

// requestFor names the request whose replies res lists.
func requestFor(res []message) string {
	for _, m := range res {
		if m == nil {
			continue
		}
		class, method := m.id()
		if name, ok := channelRequests[[2]uint16{class, method}]; ok {
			return name
		}
	}
	return "request"
}

// waitReply waits for the next message in rpc, or for errs, until ctx
// ends, where someone else reads the socket.
func waitReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error) {
	select {
	case e, ok := <-errs:
		if ok {
			return nil, e
		}
		return nil, ErrClosed
	case msg := <-rpc:
		if msg == nil {
			return nil, ErrClosed
		}
		return msg, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
