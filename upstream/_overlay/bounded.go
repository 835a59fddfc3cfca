// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Bounded calls. A context variant (bounded_methods.go) runs the call, mostly the upstream
// method, on its own goroutine, so the bound holds whatever the call blocks in. When the
// caller leaves first, the call cannot simply be forgotten: AMQP replies carry no request id,
// so the late reply would be taken for the reply to the channel's next request. A channel
// whose caller left is therefore abandoned, as the Java client's channelRpcTimeout does: it is
// closed for the application at once, and a stand-in keeps its id until the broker's
// close-ok, discarding the late reply. A connection-level request has no channel to give up:
// it ends the connection. The read modes' RPCTimeout ends a wait the same way (rpcTimedOut,
// connTimedOut).

// ErrRPCTimeout is an *RPCError's cause past DrainerOptions.RPCTimeout or LegacyOptions.RPCTimeout.
var ErrRPCTimeout = errors.New("amqp: no reply within the RPC timeout")

// RPCError is returned by a synchronous method whose reply did not come before its ctx ended (a
// ...WithContext method: errors.Is(err, context.Cause(ctx))) or before the read mode's RPCTimeout
// (errors.Is(err, ErrRPCTimeout)). If the request had been handed over, its channel (or the
// connection, for channel 0) is closed and errors.Is(err, ErrClosed): open a new channel to go on.
// Whether the broker carried the request out is unknown: a declaration may exist, a GetWithContext
// autoAck message may be gone.
type RPCError struct {
	// Method is the request, in the spec's dotted form ("queue.declare").
	Method string
	// Channel is the channel the request was sent on; 0 for the connection.
	Channel uint16
	// Err is context.Cause(ctx) or ErrRPCTimeout.
	Err error
	// Closed reports whether the channel or connection was closed; false when ctx ended
	// before anything was sent.
	Closed bool
}

// Error names the request and cause, and whether it was sent and what closed.
func (e *RPCError) Error() string {
	on, kind := "connection", "connection"
	if e.Channel != 0 {
		on, kind = fmt.Sprintf("channel %d", e.Channel), "channel"
	}
	if !e.Closed {
		return fmt.Sprintf("amqp: %s on %s not sent: %v", e.Method, on, e.Err)
	}
	return fmt.Sprintf("amqp: %s on %s: no reply: %v (the %s is closed)", e.Method, on, e.Err, kind)
}

// Unwrap makes errors.Is match the cause, and ErrClosed if Closed.
func (e *RPCError) Unwrap() []error {
	if e.Closed {
		return []error{e.Err, ErrClosed}
	}
	return []error{e.Err}
}

// errNilContext refuses a nil ctx, as the standard library's context-taking calls do.
var errNilContext = errors.New("amqp: nil Context")

// boundedRun is one bounded call's goroutine state, pooled so that a call that returns in
// time allocates no chan. An abandoned one is never pooled again: its goroutine may still be
// running, and writes err and done when it returns.
type boundedRun struct {
	call func() error
	err  error
	done chan struct{} // buffered: run never waits for the caller
}

var boundedRuns = sync.Pool{New: func() any { return &boundedRun{done: make(chan struct{}, 1)} }}

// run is the call's goroutine.
func (r *boundedRun) run() {
	r.err = r.call()
	r.done <- struct{}{}
}

// finish returns the call's error and gives r back to the pool; the caller has received
// from done, so the call's goroutine is finished with r.
func (r *boundedRun) finish() error {
	err := r.err
	*r = boundedRun{done: r.done}
	boundedRuns.Put(r)
	return err
}

// runBounded runs call bounded by ctx: its error if it returns first, else the *RPCError,
// after abandon (which must not block) got the chan that receives once call returned. An
// ended ctx runs nothing; one that cannot end (Done nil) runs call inline.
func runBounded(ctx context.Context, method string, channel uint16, call func() error,
	abandon func(cause error, ended <-chan struct{})) error {
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
	// select picks at random among ready cases: look at done once more, so that a call that
	// returned as ctx ended keeps its result rather than abandoning a channel for nothing.
	select {
	case <-r.done: // the reply and the end came together: the reply wins
		return r.finish()
	default:
	}
	cause := context.Cause(ctx)
	abandon(cause, r.done) // r is the goroutine's now: never back in the pool
	return &RPCError{Method: method, Channel: channel, Err: cause, Closed: true}
}

// bounded runs call, a method of ch, bounded by ctx; ch is abandoned if ctx ends first.
func (ch *Channel) bounded(ctx context.Context, method string, call func() error) error {
	return runBounded(ctx, method, ch.id, call,
		func(_ error, ended <-chan struct{}) { ch.abandonAfter(method, ended) })
}

// abandonAfter gives up ch at once, after its caller left before the reply to method; it does
// nothing if ch is closed, closing or abandoned already. The abandoned call may still be
// waiting for the write lock (in legacy mode, for a read to end), and its request must not
// follow the channel.close: so the stand-in writes the close only once ended receives, that
// is once the call returned (ch's shutdown ends the call's reply wait). A nil ended says the
// request was written already.
func (ch *Channel) abandonAfter(method string, ended <-chan struct{}) {
	if stand := ch.abandonToStandIn(); stand != nil {
		go func() {
			err := ch.retire(stand, "abandoned "+method, ended)
			stand.closeInBackground(err)
		}()
	}
}

// A stand-in is a Channel that holds an abandoned channel's id until the broker's close-ok:
// replies carry no request id, so a late reply to the abandoned request must reach a channel
// that discards it, not a new channel that reused the id and would take it for its own reply.
// It is registered in c.channels under c.m, and marked closing (closeInit) so that recovery
// never reopens it; dropStandIn releases the id.

// abandonToStandIn marks ch closed and gives its id to a new stand-in, under c.m; nil, with
// nothing changed, if ch no longer holds its id or is closed or closing already. ch is marked
// closing (closeInit: no recovery brings it back) and closed (nothing more is sent on it).
// The checks, the marks and the registration share one c.m section, so of two abandonments
// racing (a ctx and the RPC timeout, say) only one gets a stand-in.
func (ch *Channel) abandonToStandIn() *Channel { return ch.registerStandIn(true) }

// standInForClose gives the id of ch, whose channel.close was written, to a new stand-in that
// waits for the close-ok, under c.m; nil if ch no longer holds its id. ch itself is left as
// Close left it: Close is already shutting it down.
func (ch *Channel) standInForClose() *Channel { return ch.registerStandIn(false) }

// registerStandIn puts a new stand-in, which discards the frames it gets, on ch's id, under
// c.m; nil, with nothing changed, if ch no longer holds its id, or (abandon) if ch is closed
// or closing already. With abandon, ch is marked closing and closed first.
func (ch *Channel) registerStandIn(abandon bool) *Channel {
	c := ch.connection
	c.m.Lock()
	defer c.m.Unlock()
	if c.channels[ch.id] != ch || abandon && (ch.closeInit.Load() || ch.IsClosed()) {
		return nil
	}
	if abandon {
		ch.closeInit.Store(true)
		ch.setClosed()
	}
	stand := newChannel(c, ch.id)
	stand.closeInit.Store(true)
	c.channels[ch.id] = stand
	return stand
}

// rpcTimedOut is what the read modes' RPCTimeout does to a channel request that got no reply:
// ch is abandoned, except for Close, whose channel.close is written already: there a stand-in
// only keeps the id until the close-ok, so Close's release does not free it for reuse early.
func (ch *Channel) rpcTimedOut(res []message) error {
	name := requestFor(res)
	if name != "channel.close" {
		ch.abandonAfter(name, nil)
	} else if stand := ch.standInForClose(); stand != nil {
		go stand.closeInBackground(nil)
	}
	return &RPCError{Method: name, Channel: ch.id, Err: ErrRPCTimeout, Closed: true}
}

// connTimedOut is rpcTimedOut for channel 0: it ends the connection.
func (c *Connection) connTimedOut(res []message) error {
	// A channel-0 reply cannot be told from the next request's either, and there is no
	// stand-in for channel 0: the generation ends, and recovery (Recover) may dial again.
	name := requestFor(res)
	c.rp.abandon(&Error{Code: InternalError, Recover: true,
		Reason: name + " got no reply within the RPC timeout"})
	return &RPCError{Method: name, Err: ErrRPCTimeout, Closed: true}
}

// closeStarted reports whether a connection close began (upstream's closeInit, under
// closeM): such a wait is Close's, which CloseTimeout bounds, not RPCTimeout.
func (c *Connection) closeStarted() bool {
	c.closeM.Lock()
	defer c.closeM.Unlock()
	return c.closeInit
}

// retire shuts ch down as Close does, then sends channel.close through stand once ended
// receives (nil: at once), with the send's error. A read path sends it through its
// standInSend hook: legacy mode cuts a read in progress short there, since c.sendM's holder
// may be waiting for that read.
func (ch *Channel) retire(stand *Channel, reason string, ended <-chan struct{}) error {
	c := ch.connection
	// Close's steps: recovery stops watching ch, its state says closing, and its
	// listeners and waiters are closed, the abandoned call's reply wait among them.
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

// closeInBackground waits for a stand-in's close-ok (unless sendErr: the close was not sent,
// so none will come), then releases its id.
func (stand *Channel) closeInBackground(sendErr error) {
	if sendErr == nil {
		_ = stand.awaitCloseOk(context.Background(), false)
	}
	stand.connection.dropStandIn(stand)
}

// awaitCloseOk waits for a stand-in's close-ok until ctx ends, dropping the replies meant for
// the caller who left; with pump it reads frames if the mode needs it (legacy), as Close does.
// Without pump (a background wait) it only waits: another goroutine reads, or the
// connection's end closes the chans and ends the wait.
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

// dropStandIn releases a stand-in's id, unless the broker's channel.close did (then the id
// may be another channel's already, hence the check under c.m), and shuts the stand-in down;
// unlike releaseChannel also on a closed connection: recovery never reopens a stand-in.
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

// await is the waiting half of upstream's Channel.call, for ChannelWithContext, which
// writes channel.open itself to learn whether it was sent. With a read path it waits
// through the chanCall hook (RPCTimeout, the Observer's RPC, legacy mode's reading);
// upstream mode waits for its reader, as upstream's call does.
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

// abandonConnection ends c: a late reply to a connection-level request would pass for the
// next's. Recover is set, so recovery, where enabled, dials again.
func (c *Connection) abandonConnection(method string, cause error) {
	err := &Error{Code: InternalError, Recover: true,
		Reason: fmt.Sprintf("%s got no reply: %v", method, cause)}
	if c.rp != nil {
		c.rp.abandon(err)
		return
	}
	go c.shutdown(err)
}

// channelRequests names the requests by the class and method ids of their replies: a reply
// wait knows only the replies it expects, not the request sent.
var channelRequests = map[[2]uint16]string{
	{10, 10}: "protocol header", {10, 20}: "connection.start-ok",
	{10, 30}: "connection.start-ok", {10, 41}: "connection.open",
	{10, 51}: "connection.close", {10, 71}: "connection.update-secret",
	{20, 11}: "channel.open", {20, 21}: "channel.flow", {20, 41}: "channel.close",
	{40, 11}: "exchange.declare", {40, 21}: "exchange.delete",
	{40, 31}: "exchange.bind", {40, 51}: "exchange.unbind",
	{50, 11}: "queue.declare", {50, 21}: "queue.bind", {50, 31}: "queue.purge",
	{50, 41}: "queue.delete", {50, 51}: "queue.unbind",
	{60, 11}: "basic.qos", {60, 21}: "basic.consume", {60, 31}: "basic.cancel",
	{60, 71}: "basic.get", {60, 72}: "basic.get", {60, 111}: "basic.recover",
	{85, 11}: "confirm.select", {90, 11}: "tx.select", {90, 21}: "tx.commit",
	{90, 31}: "tx.rollback",
}

// requestFor names the request whose replies res lists: the first reply it knows decides,
// and "request" stands for one it does not know.
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

// waitReply waits until ctx ends for rpc or errs, where another goroutine reads the socket
// (upstream mode's reader, or the drainer). A closed errs, or a nil from a closed rpc, means
// the channel closed: ErrClosed, as upstream's call returns.
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
