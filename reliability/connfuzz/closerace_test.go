package connfuzz

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// gatedConn holds every write, once armed, until the socket is closed,
// which puts a write exactly in the window between the library's "is the
// connection closed?" check and the socket's close by the reader.
type gatedConn struct {
	net.Conn
	armed   atomic.Bool
	entered chan struct{} // closed when the first armed write starts
	closed  chan struct{} // closed by Close
	enter   sync.Once
	close   sync.Once
}

func newGatedConn(c net.Conn) *gatedConn {
	return &gatedConn{Conn: c, entered: make(chan struct{}), closed: make(chan struct{})}
}

func (c *gatedConn) Write(p []byte) (int, error) {
	if c.armed.Load() {
		c.enter.Do(func() { close(c.entered) })
		<-c.closed
	}
	return c.Conn.Write(p)
}

// Close closes the socket before it releases the held writes: released
// first, a write could still reach the open socket and succeed, and Close
// would then return the reader's *amqp.Error (seen once in 10 runs).
func (c *gatedConn) Close() error {
	err := c.Conn.Close()
	c.close.Do(func() { close(c.closed) })
	return err
}

// TestUpstreamCloseCanReturnTheWriteError pins an upstream behaviour that
// FuzzConnection found and therefore tolerates in upstream mode only: when
// the reader shuts the connection down on a malformed frame while Close is
// writing connection.close, Close returns the socket's *net.OpError ("use
// of closed network connection") instead of an *amqp.Error.
// Connection.send checks IsClosed, writes, and hands any write error back
// as it is; the reader's shutdown closes the socket without the send lock,
// so the write can land on a closed socket. NotifyClose still gets the
// *amqp.Error. Drainer mode returns the *amqp.Error the connection ended
// with.
//
// The gate makes the race deterministic: Close's write of connection.close
// waits until the reader, fed a frame with a bad frame-end, has closed the
// socket. Legacy mode is left out because the race cannot happen there:
// reads and writes share one transport lock, so the gated write keeps the
// bad frame from being read at all until Close's own 5 s watchdog closes
// the socket; and a read error marks the connection dead before it closes
// the socket, so a write that fails afterwards reports that *amqp.Error.
func TestUpstreamCloseCanReturnTheWriteError(t *testing.T) {
	level.Require(t)
	for _, mode := range []compat.Mode{compat.Upstream, compat.Drainer} {
		t.Run(mode.String(), func(t *testing.T) {
			bad := fakepeer.HeartbeatFrame()
			bad[len(bad)-1] = 0
			send := make(chan struct{})
			peer := listen(t, callBound, func(s *fakepeer.Session) error {
				select {
				case <-send:
				case <-s.Done():
				}
				_ = s.Send(bad) // the client may be gone already
				return nil
			})
			var gate *gatedConn
			cfg := amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
				c, err := net.Dial(network, addr)
				if err != nil {
					return nil, err
				}
				gate = newGatedConn(c)
				return gate, nil
			}}
			conn, err := compat.DialConfig(peer.URL(), cfg, mode)
			if err != nil {
				t.Fatal(err)
			}
			connDone := conn.NotifyClose(make(chan *amqp.Error, 1))
			// DrainEvents as in FuzzConnection: it must not change the
			// outcome.
			defer startDrainLoop(t, conn)()

			gate.armed.Store(true)
			closed := make(chan error, 1)
			go func() { closed <- conn.Close() }()
			select {
			case <-gate.entered:
			case err := <-closed:
				t.Fatalf("Close returned %v without writing connection.close", err)
			case <-time.After(callBound):
				t.Fatal("Close never wrote connection.close")
			}
			close(send)

			var closeErr error
			select {
			case closeErr = <-closed:
			case <-time.After(callBound):
				t.Fatalf("Close did not return within %s", callBound)
			}
			select {
			case e := <-connDone:
				t.Logf("NotifyClose: %v", e)
			case <-time.After(callBound):
				t.Fatalf("NotifyClose was neither sent to nor closed within %s", callBound)
			}
			t.Logf("Close: %v (%T)", closeErr, closeErr)
			var op *net.OpError
			isOp := errors.As(closeErr, &op)
			if mode == compat.Upstream {
				if !isOp || op.Op != "write" {
					t.Fatalf("upstream's Close returned %v (%T); this test pins the write's *net.OpError: "+
						"if upstream changed, drop the exemption in run", closeErr, closeErr)
				}
				return
			}
			if !isAMQPError(closeErr) {
				t.Fatalf("Close returned %v (%T), want an *amqp.Error", closeErr, closeErr)
			}
		})
	}
}
