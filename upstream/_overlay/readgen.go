// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
)

// One generation lifecycle, for both read modes.
//
// readBase runs what the drainer and legacy mode do alike with a
// connection generation: which one is current, its abandon and shutdown,
// the RPC waits (the Observer's view, RPCTimeout), channel 0's reply
// overflow and blocked/unblocked, and the routing of frames, with the
// Observer calls it makes. A mode supplies what differs (readMode).

// readMode is what a read mode supplies to readBase.
type readMode interface {
	// generation is the current generation, nil before the first (genSlot).
	generation() *readGen

	// awaitReply waits until ctx ends for the reply in rpc, the channel's
	// errors (nil for channel 0) or the end of the generation. A reply that
	// came before the error or end that woke it is returned, as upstream.
	awaitReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error)

	// flush runs in shutdown once the socket is closed: notifications of
	// frames read before the end reach their listeners.
	flush()

	// notifyBlocked hands b to the NotifyBlocked listeners ls.
	notifyBlocked(ls []chan Blocking, b Blocking)

	// consumerReader is how a ConsumeFunc with nothing queued reads the
	// socket itself, nil where a goroutine of the connection reads it.
	consumerReader() consumerReader
}

// consumerReader reads the socket for a ConsumeFunc that found its inbox
// empty (directconsume.go), in legacy mode: it takes the read turn by
// sending into readTurn, then reads one turn for box (legacyConn.pumpFor).
type consumerReader interface {
	readTurn() chan struct{}
	pumpFor(ctx context.Context, box *inbox) error
}

// genSlot holds a read mode's current generation, of the mode's type G.
type genSlot[G any, P interface {
	*G
	shared() *readGen
}] struct {
	mu  sync.Mutex
	gen P
}

// current is the current generation, nil before the first.
func (s *genSlot[G, P]) current() P {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// replace makes g current and returns the generation it replaces.
func (s *genSlot[G, P]) replace(g P) (prev P) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, s.gen = s.gen, g
	return prev
}

// generation is readMode.generation.
func (s *genSlot[G, P]) generation() *readGen {
	if g := s.current(); g != nil {
		return g.shared()
	}
	return nil
}

// shared is the part of a mode's generation that readBase runs.
func (g *readGen) shared() *readGen { return g }

// abandon fails the current generation with err, off the caller's
// goroutine: the teardown may wait for what the mode still runs
// (bounded.go).
func (b *readBase) abandon(err *Error) {
	if g := b.mode.generation(); g != nil {
		go b.fail(g, err)
	}
}

// shutdown is the read path's shutdown hook, the first thing
// Connection.shutdown does: it records why, releases every waiter, and
// closes the socket before upstream takes any lock, so that a publisher
// blocked in a write (holding ch.m and sendM) is freed and the teardown
// that follows cannot deadlock on it. The mode's flush runs after the
// socket is closed and before the Observer hears of the end.
func (b *readBase) shutdown(err *Error) {
	b.blocks.unblock() // held publishes go on, and fail as upstream's
	if err == nil {
		b.stopWatchdog()
	}
	g := b.mode.generation()
	if g == nil {
		return
	}
	b.c.closed.Store(true) // as upstream's first statement, before waiters wake
	g.setDead(err)
	_ = g.conn.Close()
	b.mode.flush()
	observeEnd(b.obs, b.name, &g.genEnd, err)
}

// connCall waits for the reply to a channel-0 request, bounded by
// RPCTimeout except during Close, whose own wait is CloseTimeout's
// (closeStarted takes a lock, so only when there is a timeout to apply).
// Close's own wait is marked (closerKey), so that legacy's reads do not
// take it for a wait that Close ended.
func (b *readBase) connCall(_ chan *Error, rpc chan message, res []message) error {
	return observedWait(b.obs, 0, res, func() error {
		ctx := context.Background()
		if b.isCalled() {
			ctx = context.WithValue(ctx, closerKey{}, true)
		}
		ctx, cancel := b.rpcContext(ctx, b.rpcTimeout > 0 && b.c.closeStarted())
		defer cancel()
		m, err := b.mode.awaitReply(ctx, nil, rpc)
		switch {
		case err == nil:
			return matchReply(m, res)
		case ctx.Err() != nil:
			return b.c.connTimedOut(res)
		}
		return err
	})
}

// closing wakes DrainEvents callers and arms the watchdog that bounds
// Close (closeIntent.begin).
func (b *readBase) closing() {
	if g := b.mode.generation(); g != nil {
		b.begin(b.closeTimeout, &g.genEnd, g.conn)
	} else {
		b.begin(b.closeTimeout, nil, nil)
	}
}

// chanCall waits for the reply to a request on channel ch, bounded by
// RPCTimeout. Every waiter released by a connection error gets that
// error, unless its reply came before the end (readMode.awaitReply).
func (b *readBase) chanCall(ch *Channel, errs chan *Error, rpc chan message, res []message) error {
	return observedWait(b.obs, ch.id, res, func() error {
		ctx, cancel := b.rpcContext(context.Background(), false)
		defer cancel()
		m, err := b.mode.awaitReply(ctx, errs, rpc)
		switch {
		case err != nil && ctx.Err() != nil:
			return ch.rpcTimedOut(res)
		case err != nil:
			return err
		case m == nil:
			return ErrClosed
		}
		return matchReply(m, res)
	})
}

// rpcContext bounds a reply's wait by RPCTimeout, unless there is none or
// exempt is true. Legacy pumps under it, so its end also cuts a read
// short.
func (b *readBase) rpcContext(ctx context.Context, exempt bool) (context.Context, context.CancelFunc) {
	if b.rpcTimeout <= 0 || exempt {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.rpcTimeout)
}

// chanErr is what a caller waiting on a channel's errors returns: the
// channel's error, or, once the channel is gone, why.
func (b *readBase) chanErr(g *readGen, e *Error, ok bool) error {
	switch {
	case ok:
		return e
	case g.isDead():
		return b.waitErr(&g.genEnd)
	}
	return ErrClosed
}

// replyOverflow returns the error to fail the connection with when m, a
// reply on channel 0, finds connRPCCap replies already waiting in g.rpc.
// Upstream's dispatch0 would wait for a caller, but the dispatcher may be
// that very caller (legacy's turn holder) or read for everybody (the
// drainer): DrainEvents and Close would hang. Only the dispatcher sends on
// g.rpc, so a free slot seen here stays free for its send.
func (g *readGen) replyOverflow(m message) *Error {
	if len(g.rpc) < cap(g.rpc) {
		return nil
	}
	return &Error{Code: UnexpectedFrame, Reason: fmt.Sprintf(
		"unexpected %T on channel 0: %d replies already wait for a caller", m, connRPCCap)}
}

// notifyBlocks tracks connection.blocked and connection.unblocked for the
// publish gate (blockgate.go) and hands them to the NotifyBlocked
// listeners the mode's way, in place of upstream's dispatch0. It reports
// whether m was one of them.
func (b *readBase) notifyBlocks(m message) bool {
	var blk Blocking
	switch m := m.(type) {
	case *connectionBlocked:
		b.blocks.block()
		blk = Blocking{Active: true, Reason: m.Reason}
	case *connectionUnblocked:
		b.blocks.unblock()
	default:
		return false
	}
	c := b.c
	c.m.Lock()
	ls := c.blocks
	c.m.Unlock()
	b.mode.notifyBlocked(ls, blk)
	return true
}

// frameRouter is a mode's generation, where routeFrames hands frames on:
// the drainer queues them, legacy dispatches them inline.
type frameRouter interface {
	// handOn takes what a frame of a channel came to (routeChannel).
	handOn(step chanStep)
	// route0 takes a frame of channel 0. It reports stop when reading
	// must end, with the error to fail the connection with, if any.
	route0(f frame) (stop bool, err *Error)
	// endedInline reports whether the generation ended while a frame
	// was handed on (connection.close, or the teardown ran inline).
	endedInline() bool
}

// routeFrames routes raw, if not nil, and every other complete frame in
// split's buffer to r. It reports stop when reading must end, with the
// error to fail the connection with, if any.
func (b *readBase) routeFrames(r frameRouter, cr *contentReader, split *frameSplitter, raw []byte) (stop bool, err *Error) {
	for ; ; raw = nil {
		if raw == nil {
			var err error
			if raw, err = split.next(); err != nil {
				return true, &Error{Code: FrameError, Reason: err.Error()}
			} else if raw == nil {
				return false, nil
			}
		}
		if id := binary.BigEndian.Uint16(raw[1:3]); id != 0 {
			if err := b.routeChannel(r, cr, split, id, raw); err != nil {
				return true, err
			}
		} else if f, err := split.parse(raw); err != nil {
			return true, &Error{Code: FrameError, Reason: fmt.Sprintf("malformed frame: %v", err)}
		} else if stop, err := r.route0(f); stop {
			return true, err
		}
		if r.endedInline() {
			return true, nil
		}
	}
}

// routeChannel is the one router of the frames of channel id ≠ 0, for both
// modes: raw is decoded and assembled (channelFrame), the Observer hears
// of confirms and returns as they arrive, and the result goes to r.
func (b *readBase) routeChannel(r frameRouter, cr *contentReader, split *frameSplitter, id uint16, raw []byte) *Error {
	step, err := cr.channelFrame(b.c, split, id, raw)
	if err != nil {
		return err
	}
	if b.obs != nil {
		b.observeStep(step)
	}
	r.handOn(step)
	return nil
}

// observeStep tells the Observer of a confirm or a return in step. Only
// called with an Observer: without one, the router does no more per frame
// than the hand-on.
func (b *readBase) observeStep(step chanStep) {
	switch {
	case step.method != nil:
		switch m := step.method.Method.(type) {
		case *basicAck:
			step.ch.observeConfirm(m.DeliveryTag, m.Multiple, true)
		case *basicNack:
			step.ch.observeConfirm(m.DeliveryTag, m.Multiple, false)
		}
	case step.msg != nil:
		if r, ok := step.msg.(*basicReturn); ok && b.obs.Returned != nil {
			b.obs.Returned(newReturn(*r))
		}
	}
}
