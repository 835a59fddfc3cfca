// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
	"net"
	"time"
)

// autoDrainWait bounds each DrainEvents call of the auto-drain loop: one
// wake-up per wait while idle. A write does not wait for it: it cuts the
// loop's read short (transportGuard.lock in legacy.go).
const autoDrainWait = 50 * time.Millisecond

// autoDrain is LegacyOptions.AutoDrain: the drain loop of one generation,
// started with it (legacyConn.start). It ends when the application closes
// the connection (ErrClosedIntentionally) or when g ends; a recovery's next
// generation starts its own loop, so nothing waits between generations and
// nothing outlives the connection.
func (l *legacyConn) autoDrain(g *legacyGen) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), autoDrainWait)
		err := l.drainOn(ctx, g)
		cancel()
		switch {
		case err == nil, errors.Is(err, context.DeadlineExceeded):
			if g.isDead() {
				return
			}
		case errors.Is(err, ErrClosedIntentionally):
			// Close pumps for its own close-ok, as a legacy application's
			// drain loop stops here. Over io.Pipe, though, nothing is
			// buffered and reads cannot be cut short: keep reading
			// alongside Close until the end, or a peer writing to us would
			// block the close handshake. Never over a net.Conn, where that
			// read would hold the transport lock that Close's
			// connection.close must take to be written.
			if _, isNet := g.conn.(net.Conn); !isNet {
				_, _ = l.await(context.WithValue(context.Background(), closerKey{}, true), g, nil, nil, g.dead)
			}
			return
		default:
			// Every other error of drainOn is the end of g: the
			// connection failed, and recovery, if any, starts a new loop.
			return
		}
	}
}
