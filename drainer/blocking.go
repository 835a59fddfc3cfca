package drainer

import (
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A Dialer is amqp.Config.Dial's type.
type Dialer = func(network, addr string) (net.Conn, error)

// MaxBlockingConns is how many sockets of one process BlockingDialer reads with blocking
// system calls at once. Each holds an OS thread while it waits, and a Go program that
// passes 10,000 threads (runtime/debug.SetMaxThreads) is killed; a connection dialled
// past the cap reads through the network poller, as without BlockingDialer.
const MaxBlockingConns = 1024

// BlockingDialer returns a dialler for amqp.Config.Dial whose TCP sockets are read with
// blocking read(2) on the reading goroutine's own thread, instead of through Go's network
// poller. dial makes the connection (nil: amqp.DefaultDial(timeout)); timeout bounds the
// TLS and AMQP handshakes, as DefaultDial's deadline does (zero: 30 s, upstream's default).
//
// Why: with the poller, each read that finds the socket empty parks the reader, and the
// data's arrival wakes a thread that polls and then the reader: two context switches
// where a blocked read(2) has one. In the drain benchmark, the drainer spends 0.55× the
// CPU per delivery with it through a Consume chan, and 0.72× through ConsumeFunc
// (docs/benchmarking.md has the figures). The price is one OS thread per connection, idle or not, and a few more
// threads' worth of memory; it pays where a few connections carry many messages, not
// where thousands sit idle.
//
// For the drainer and upstream modes, where one goroutine reads the socket and nothing
// cuts its read short: a deadline set during a read applies from the next read, and Close
// ends a read at once (shutdown(2)). Legacy mode cuts reads short for every write, so
// compat refuses the pair (compat.WithBlockingRead). On systems other than Linux, and for
// a connection that is not a *net.TCPConn (a custom Dial's), the socket is read through
// the poller as usual. TLS works: DialConfig wraps the socket this dialler returns.
//
// Writes use blocking write(2) and writev(2) as well; a write deadline is a send
// timeout, enforced the same way.
func BlockingDialer(dial Dialer, timeout time.Duration) Dialer {
	if timeout <= 0 {
		timeout = defaultHandshakeTimeout
	}
	if dial == nil {
		dial = amqp.DefaultDial(timeout)
	}
	return func(network, addr string) (net.Conn, error) {
		conn, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		return BlockingConn(conn, timeout)
	}
}

// BlockingConn is BlockingDialer's work on a socket dialled already: it returns a net.Conn
// that reads conn's socket with blocking system calls, with a deadline of timeout from now
// for the handshakes, and closes conn (the socket stays open). It returns conn itself when
// it cannot: not Linux, not a *net.TCPConn, or MaxBlockingConns reached. On an error conn
// is closed.
func BlockingConn(conn net.Conn, timeout time.Duration) (net.Conn, error) {
	return blockingSocket(conn, timeout)
}

// defaultHandshakeTimeout is upstream's connection timeout, for a zero timeout.
const defaultHandshakeTimeout = 30 * time.Second
