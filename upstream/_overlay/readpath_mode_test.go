// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// testReadModeEnv forces a read mode on every connection that this package's
// tests open through Open or Dial* without a Config.ReadPath, so that
// upstream's own suite runs unchanged against another read path. Only this
// test file reads it: production builds never look at the environment.
const testReadModeEnv = "AMQP091_DRAINER_TEST_READ_MODE"

func init() {
	switch mode := os.Getenv(testReadModeEnv); mode {
	case "", "upstream":
		defaultReadPath = nil
	case "seam-probe":
		defaultReadPath = seamProbe{}
	case "drainer":
		defaultReadPath = Drainer(DrainerOptions{})
	case "legacy":
		defaultReadPath = Legacy(LegacyOptions{})
	case "legacy-autodrain":
		defaultReadPath = legacyAutoDrain{}
	default:
		panic(fmt.Sprintf("%s=%q: want one of upstream, seam-probe, drainer, legacy, legacy-autodrain", testReadModeEnv, mode))
	}
}

// legacyAutoDrain is legacy mode plus what a legacy application must add to
// receive deliveries, confirms and notifications: a goroutine that loops
// DrainEvents with a short timeout. Upstream's tests expect those to arrive
// without anyone draining, so this is the variant that runs most of them.
type legacyAutoDrain struct{}

func (legacyAutoDrain) Mode() string { return "legacy" }

func (legacyAutoDrain) attach(c *Connection) readPath {
	l := Legacy(LegacyOptions{}).attach(c).(*legacyConn)
	go autoDrain(c, l)
	return l
}

// autoDrain drains until the connection is closed for good.
func autoDrain(c *Connection, l *legacyConn) {
	// attach runs just before start sets up the first generation.
	for tick := time.NewTicker(time.Millisecond); l.current() == nil; {
		<-tick.C
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := l.drain(ctx)
		cancel()
		switch {
		case err == nil, errors.Is(err, context.DeadlineExceeded):
		case errors.Is(err, ErrClosedIntentionally):
			// Close pumps for its own close-ok, as a legacy application's
			// drain loop stops here. Over io.Pipe, though, nothing is
			// buffered and reads cannot be cut short: keep reading
			// alongside Close until the end, or a peer writing to us would
			// block the close handshake. Never over a net.Conn, where that
			// read would hold the transport lock that Close's
			// connection.close must take to be written.
			if g := l.current(); g != nil {
				if _, isNet := g.conn.(net.Conn); !isNet {
					_, _ = l.await(context.WithValue(context.Background(), closerKey{}, true), g, nil, nil, g.dead)
				}
			}
			return
		case !c.IsRecoveryEnabled():
			return
		default:
			// Failed with recovery on: wait for the next generation.
			<-time.After(10 * time.Millisecond)
		}
	}
}
