// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
)

// readMode is what a read mode supplies to readBase's methods here.
type readMode interface {
	generation() *readGen // nil before the first (genSlot)
	// awaitReply waits for the reply in rpc, errs (nil for channel 0), the
	// end or ctx's; a reply that came before the error or end wins.
	awaitReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error)
	flush()                                       // in shutdown, once the socket is closed
	notifyBlocked(ls []chan Blocking, b Blocking) // to the NotifyBlocked listeners
	consumerReader() consumerReader               // legacy's turn, or the drainer's lease (readlease.go)
}

// consumerReader is a ConsumeFunc's own read (directconsume.go):
// send into readTurn to take the turn, then pumpFor reads one for box.
type consumerReader interface {
	readTurn() chan struct{}
	pumpFor(ctx context.Context, box *inbox) error
}

// genSlot holds a read mode's current generation, of type G.
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

// abandon fails the current generation on its own goroutine: the
// teardown may wait for what the mode still runs (bounded.go).
func (b *readBase) abandon(err *Error) {
	if g := b.mode.generation(); g != nil {
		go b.fail(g, err)
	}
}

// shutdown releases the waiters and closes the socket before upstream locks,
// freeing a publisher blocked in a write (holding ch.m and sendM).
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

// connCall waits for a channel-0 reply under RPCTimeout but not during
// Close (closeStarted locks). closerKey marks Close's wait for legacy.
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

// closing wakes DrainEvents callers and arms Close's watchdog.
func (b *readBase) closing() {
	if g := b.mode.generation(); g != nil {
		b.begin(b.closeTimeout, &g.genEnd, g.conn)
	} else {
		b.begin(b.closeTimeout, nil, nil)
	}
}

// chanCall waits for a reply on ch under RPCTimeout (readMode.awaitReply).
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

// rpcContext bounds a wait by RPCTimeout, if any, unless exempt.
func (b *readBase) rpcContext(ctx context.Context, exempt bool) (context.Context, context.CancelFunc) {
	if b.rpcTimeout <= 0 || exempt {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.rpcTimeout)
}

// chanErr is a channel waiter's error: e or, once the channel is gone, why.
func (b *readBase) chanErr(g *readGen, e *Error, ok bool) error {
	switch {
	case ok:
		return e
	case g.isDead():
		return b.waitErr(&g.genEnd)
	}
	return ErrClosed
}

// replyOverflow fails the connection when g.rpc is full: upstream waits, a
// hang when the dispatcher is the caller or reads for all (sole sender).
func (g *readGen) replyOverflow(m message) *Error {
	if len(g.rpc) < cap(g.rpc) {
		return nil
	}
	return &Error{Code: UnexpectedFrame, Reason: fmt.Sprintf(
		"unexpected %T on channel 0: %d replies already wait for a caller", m, connRPCCap)}
}

// notifyBlocks takes connection.blocked/unblocked for the publish gate
// and the listeners, reporting whether m was one (upstream's dispatch0).
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
	b.c.m.Lock()
	ls := b.c.blocks
	b.c.m.Unlock()
	b.mode.notifyBlocked(ls, blk)
	return true
}

// frameRouter is a mode's generation. route0's stop ends reading;
// endedInline reports that a hand-on ended the generation.
type frameRouter interface {
	handOn(step chanStep)
	route0(f frame) (stop bool, err *Error)
	endedInline() bool
}

// routeFrames routes raw, if not nil, then split's complete frames to r.
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
			step, err := cr.channelFrame(b.c, split, id, raw)
			if err != nil {
				return true, err
			}
			if b.obs != nil {
				b.observeStep(step)
			}
			r.handOn(step)
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

// observeStep tells the Observer (not nil) of a confirm or return.
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
