// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"net"
	"time"
)

// autoDrainWait bounds each drain: one wake-up per wait while idle.
const autoDrainWait = 50 * time.Millisecond

// autoDrain is AutoDrain's loop for g, until Close or g's end.
func (l *legacyConn) autoDrain(g *legacyGen) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), autoDrainWait)
		err := l.drainOn(ctx, g)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			// Close or g's end. After Close over io.Pipe, read alongside Close's pump, or a peer
			// writing to us blocks the handshake; over a net.Conn that read would hold the
			// transport lock that connection.close needs.
			if _, isNet := g.conn.(net.Conn); !isNet && errors.Is(err, ErrClosedIntentionally) {
				_, _ = l.await(context.WithValue(context.Background(), closerKey{}, true), g, nil, nil, g.dead)
			}
			return
		}
		if g.isDead() {
			return
		}
	}
}
