// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// readMode is the boundary between the two read modes: all that a mode supplies. readBase
// does the rest the same way for both (the seam's hooks, the read step, the reply wait,
// shutdown), and two of its fields say who takes the read turn (readTurn): holder, and
// callerRead.
type readMode interface {
	// start begins a generation on conn: its socket writer, and the holder goroutine if
	// the mode has one. c.m and c.sendM are not held; the handshake has not begun.
	start(conn io.ReadWriteCloser)
	// generation is the current generation, nil before the first (genSlot).
	generation() *readGen
	// fill reads the socket once into the generation's splitter by deadline (zero: none);
	// ctx, if not nil, may cut the read short. The turn is held.
	fill(g *readGen, deadline time.Time, ctx context.Context) (int, error)
	// handOn takes a routed channel frame's step: queued for the channel's dispatcher
	// (drainer), or dispatched inline as upstream's reader does (legacy).
	handOn(step chanStep)
	// route0 takes a channel-0 frame; stop ends reading, with err (nil: connection.close).
	route0(g *readGen, f frame) (stop bool, err *Error)
	// flush runs in shutdown, once the socket is closed: what was read reaches listeners.
	flush()
	// notifyBlocked tells the NotifyBlocked listeners.
	notifyBlocked(ls []chan Blocking, b Blocking)
	// standInSend runs a stand-in's channel.close send (bounded.go), which must not wait
	// for a read: the read may be the abandoned call's own.
	standInSend(send func() error) error
	// stats fills in the mode's part of Stats.
	stats(s *Stats, now time.Time)
}

// genSlot holds a read mode's current generation.
type genSlot struct{ gen atomic.Pointer[readGen] }

// generation is the current generation, nil before the first (readMode.generation).
func (s *genSlot) generation() *readGen { return s.gen.Load() }

// replace makes g current and returns the generation it replaces.
func (s *genSlot) replace(g *readGen) (prev *readGen) { return s.gen.Swap(g) }

// heartbeater takes over upstream's heartbeater goroutine: the read step sends heartbeats
// (readstep.go), timed by read deadlines, so it needs a net.Conn. Legacy never runs
// upstream's goroutine either: its writes would wait for the caller's read.
func (b *readBase) heartbeater(interval time.Duration, _ chan struct{}) bool {
	g := b.mode.generation()
	if _, ok := g.conn.(net.Conn); !ok && !b.inline {
		return false
	}
	g.interval.Store(int64(interval))
	return true
}

// opened marks the handshake done, and cuts short a read in progress: upstream cleared
// the socket's deadlines as the handshake ended, and the next step sets the heartbeat's.
func (b *readBase) opened() {
	g := b.mode.generation()
	g.opened.Store(true)
	b.countOpened()
	g.interrupt()
}

// closing wakes DrainEvents callers and arms Close's watchdog. In legacy it also cuts
// short a read in progress, so that Close can take the turn and read its close-ok, and
// AutoDrain sees Close. The drainer's holder reads the close-ok itself: nothing to cut.
func (b *readBase) closing() {
	g := b.mode.generation()
	if g == nil {
		b.begin(b.closeTimeout, nil, nil)
		return
	}
	b.begin(b.closeTimeout, &g.genEnd, g.conn)
	if b.inline {
		g.interrupt()
	}
}

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
