// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"time"
)

// connCall waits for a channel-0 reply under RPCTimeout, except during Close, whose own
// bound is CloseTimeout (its watchdog): closeStarted reads c.closeM. closerKey marks
// Close's wait, which legacy's pump lets read after Close began (isCloser).
func (b *readBase) connCall(_ chan *Error, rpc chan message, res []message) error {
	return observedWait(b.obs, 0, res, func() error {
		ctx := context.Background()
		if b.isCalled() {
			ctx = context.WithValue(ctx, closerKey{}, true)
		}
		ctx, cancel := b.rpcContext(ctx, b.rpcTimeout > 0 && b.c.closeStarted())
		defer cancel()
		m, err := b.awaitReply(ctx, b.mode.generation(), replyWait{rpc: rpc})
		switch {
		case err == nil:
			return matchReply(m, res)
		case ctx.Err() != nil:
			return b.c.connTimedOut(res)
		}
		return err
	})
}

// chanCall waits for a reply on ch under RPCTimeout.
func (b *readBase) chanCall(ch *Channel, errs chan *Error, rpc chan message, res []message) error {
	return observedWait(b.obs, ch.id, res, func() error {
		ctx, cancel := b.rpcContext(context.Background(), false)
		defer cancel()
		m, err := b.awaitReply(ctx, b.mode.generation(), replyWait{errs: errs, rpc: rpc})
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

// nextReply waits until ctx ends for the next message in rpc, or errs: a stand-in's
// close-ok, and Channel.CloseWithContext's (bounded.go). Through the one reply wait, so in
// legacy the waiter reads for itself; a closed rpc (nil message) is ErrClosed, as for
// chanCall.
func (b *readBase) nextReply(ctx context.Context, errs chan *Error,
	rpc chan message) (message, error) {
	g := b.mode.generation()
	if g == nil {
		return waitReply(ctx, errs, rpc)
	}
	m, err := b.awaitReply(ctx, g, replyWait{errs: errs, rpc: rpc})
	if err == nil && m == nil {
		err = ErrClosed
	}
	return m, err
}

// rpcContext bounds a wait by RPCTimeout, if any, unless exempt. The bound is a ctx, not a
// timer of the wait's own, because in legacy the waiter reads meanwhile, and its read
// must end with the wait (fill hooks ctx to the read).
func (b *readBase) rpcContext(ctx context.Context,
	exempt bool) (context.Context, context.CancelFunc) {
	if b.rpcTimeout <= 0 || exempt {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.rpcTimeout)
}

// replyWait is what a caller waits for: a reply in rpc, done closing (a confirmation), or
// an error in errs (a channel's). A nil chan never fires, so one wait serves a channel's
// RPC (errs, rpc), a connection's (rpc) and a confirmation (done).
type replyWait struct {
	errs chan *Error
	rpc  <-chan message
	done <-chan struct{}
}

// awaitReply is the one reply wait, for both modes: RPCs, stand-ins' close-ok, and
// legacy's confirmation waits all come here. It ends at the reply, done, an error on
// errs, the generation's end or ctx's.
//
// Who reads meanwhile: in the drainer the holder does, and the wait first takes the turn
// back from a lessee (reclaim), which might otherwise be parked on the caller's own
// channel. In legacy the waiter competes for the turn and, holding it, reads itself
// (callerRead); while AutoDrain holds the turn the waiter just waits.
//
// The order it keeps, as upstream's: a reply routed before the end wins over the end
// (replyWins). That holds because one turn holder routes both, in frame order: the reply
// is in rpc (buffered, so routing never waits for the caller) before the end is marked.
func (b *readBase) awaitReply(ctx context.Context, g *readGen, w replyWait) (message, error) {
	g.turn.reclaim()
	var turn chan struct{}
	if b.callerRead != nil {
		turn = g.turn.slot
	}
	var err error
	closing := false // legacy: Close began and reads for itself; this waiter stopped reading
	for err == nil {
		select {
		case m := <-w.rpc:
			return m, nil
		case e, ok := <-w.errs:
			err = b.chanErr(g, e, ok)
			if !ok && closing && !g.isDead() {
				err = ErrClosedIntentionally
			}
		case <-w.done:
			return nil, nil
		case <-g.dead:
			err = b.waitErr(&g.genEnd)
		case <-ctx.Done():
			err = ctx.Err()
		case turn <- struct{}{}:
			var m message
			var over bool
			if m, over, err = b.readForReply(ctx, g, w); over && err == nil {
				return m, nil
			}
			if errors.Is(err, ErrClosedIntentionally) {
				turn, closing, err = nil, true, nil // Close reads its close-ok itself
			}
		}
	}
	return b.replyWins(ctx, g, w, err)
}

// readForReply is a legacy waiter's turn: an outcome that came before it wins over reading
// on (over); else one callerRead. It gives the turn back.
func (b *readBase) readForReply(ctx context.Context, g *readGen,
	w replyWait) (m message, over bool, err error) {
	defer g.turn.release()
	select {
	case m := <-w.rpc:
		return m, true, nil
	case e, ok := <-w.errs:
		return nil, true, b.chanErr(g, e, ok)
	case <-w.done:
		return nil, true, nil
	default:
	}
	if g.isDead() {
		return nil, true, b.waitErr(&g.genEnd)
	}
	err = b.callerRead(ctx, g, false)
	if errors.Is(err, errInterrupted) {
		err = nil // a writer or a stand-in cut the read short: wait again
	}
	return nil, false, err
}

// replyWins ends a wait that err ended: a reply already in rpc is returned instead. In the
// drainer the end may overtake what the dispatchers still run (a reply queued behind a
// delivery on the same channel), so a channel's caller waits for them first, bounded by
// CloseTimeout; b.pending is nil in legacy, which dispatches inline.
func (b *readBase) replyWins(ctx context.Context, g *readGen, w replyWait,
	err error) (message, error) {
	wait := w.errs != nil && ctx.Err() == nil && b.pending != nil
	for {
		select {
		case msg := <-w.rpc:
			return msg, nil
		default:
		}
		if !wait || !g.isDead() {
			return nil, err
		}
		wait = false
		b.pending.waitIdle(time.Now().Add(b.closeTimeout))
	}
}

// chanErr is a channel waiter's error: e, the channel's own error; or, once errs is
// closed (the channel is gone), why: the generation's end if it ended (so a caller learns
// of the lost connection, not just a closed channel), else ErrClosed as upstream.
func (b *readBase) chanErr(g *readGen, e *Error, ok bool) error {
	switch {
	case ok:
		return e
	case g.isDead():
		return b.waitErr(&g.genEnd)
	}
	return ErrClosed
}

// drainEvents is DrainEvents. With a holder it waits for the holder to route a frame;
// without one (plain legacy) the caller takes the turn and reads.
//
// With a holder, "a frame routed after the call began" is a count, taken before the wait:
// routeFrame counts a frame before the mode routes it, and the holder wakes waiters
// after the step, so a frame counted before the load is never taken for a new one.
func (b *readBase) drainEvents(ctx context.Context) error {
	g := b.mode.generation()
	if g == nil {
		return ErrClosed
	}
	if !b.holder {
		return b.callerDrain(ctx, g)
	}
	seen := g.activity.frames.Load()
	select {
	case <-b.calledC:
	case <-g.dead:
	default:
		err := g.activity.waitFrames(ctx, seen, g.dead, b.calledC)
		if !errors.Is(err, errEnded) {
			return err
		}
	}
	if b.isCalled() {
		return ErrClosedIntentionally
	}
	return b.waitErr(&g.genEnd)
}

// callerDrain is DrainEvents without a holder: take the turn, read until a frame is
// routed. After Close it returns ErrClosedIntentionally, not g's end.
//
// Close may begin while the caller waits for the turn, so it looks again once it holds
// it: Close's own wait reads its close-ok, and a DrainEvents that read on could route it
// while Close is not yet waiting, or hold the transport lock Close's write needs.
func (b *readBase) callerDrain(ctx context.Context, g *readGen) error {
	for {
		select {
		case <-b.calledC:
			return ErrClosedIntentionally
		case <-ctx.Done():
			return ctx.Err()
		case g.turn.slot <- struct{}{}:
		}
		if b.isCalled() {
			g.turn.release()
			return ErrClosedIntentionally
		}
		err := b.callerRead(ctx, g, false)
		g.turn.release()
		switch {
		case errors.Is(err, errInterrupted):
			continue
		case err != nil && ctx.Err() == nil && b.isCalled():
			return ErrClosedIntentionally
		}
		return err
	}
}
