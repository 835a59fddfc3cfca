// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"io"
	"sync/atomic"
	"time"
)

// seamProbe is a test-only read path that keeps upstream's semantics while
// routing through every hook of the seam, and counts the hooks it sees.
// Forcing it on upstream's whole suite (AMQP091_DRAINER_TEST_READ_MODE=
// seam-probe) shows that the seam reaches every place a connection starts
// reading and every RPC wait, and that going through it changes nothing.
type seamProbe struct{}

func (seamProbe) Mode() string { return "seam-probe" }

// attach fixes a base with upstream's values: unbuffered rpc chans, no
// delivery budget, no confirm pump, a publish gate that never blocks
// (upstream's reader holds no publish back) and no socket writer of its
// own, so publishes write through c.writer as upstream's do.
func (seamProbe) attach(c *Connection) readPath {
	p := &seamProbeConn{}
	p.c, p.name = c, "seam-probe"
	return p
}

type seamProbeConn struct {
	readBase

	starts, heartbeaters, connCalls, chanCalls, openeds, closings, shutdowns atomic.Int64
}

func (p *seamProbeConn) start(conn io.ReadWriteCloser) {
	p.starts.Add(1)
	go p.c.reader(conn)
}

func (p *seamProbeConn) heartbeater(time.Duration, chan struct{}) bool {
	p.heartbeaters.Add(1)
	return false
}

// connCall waits exactly as upstream's Connection.call does.
func (p *seamProbeConn) connCall(errors chan *Error, rpc chan message, res []message) error {
	p.connCalls.Add(1)
	select {
	case e, ok := <-errors:
		if ok {
			return e
		}
		return ErrClosed
	case m, ok := <-rpc:
		if !ok {
			select {
			case e, ok := <-errors:
				if ok {
					return e
				}
			default:
			}
			return ErrClosed
		}
		return matchReply(m, res)
	}
}

// chanCall waits exactly as upstream's Channel.call does.
func (p *seamProbeConn) chanCall(_ *Channel, errors chan *Error, rpc chan message, res []message) error {
	p.chanCalls.Add(1)
	select {
	case e, ok := <-errors:
		if ok {
			return e
		}
		return ErrClosed
	case msg := <-rpc:
		if msg == nil {
			return ErrClosed
		}
		return matchReply(msg, res)
	}
}

func (p *seamProbeConn) opened() { p.openeds.Add(1) }

func (p *seamProbeConn) closing() { p.closings.Add(1) }

// drainEvents: the probe runs upstream's reader, which signals dispatches.
func (p *seamProbeConn) drainEvents(ctx context.Context) error { return p.c.drainUpstream(ctx) }

func (p *seamProbeConn) shutdown(*Error) { p.shutdowns.Add(1) }
func (p *seamProbeConn) abandon(*Error)  {}

func (p *seamProbeConn) standInSend(send func() error) error { return send() }

func (p *seamProbeConn) nextReply(ctx context.Context, errs chan *Error, rpc chan message) (message, error) {
	return waitReply(ctx, errs, rpc)
}

func (p *seamProbeConn) stats(*Stats, time.Time) {}
