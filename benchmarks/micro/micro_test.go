// Package micro holds go test micro-benchmarks of the client's two hot
// paths, publish encoding and delivery decoding, against the in-process
// fake broker of internal/fakepeer rather than RabbitMQ, so that B/op and
// allocs/op are the client's alone and ns/op is not bound by a broker's
// flow control. Every benchmark runs once per read mode the build offers,
// and the package compiles against pristine upstream too:
//
//	go test -run x -bench . -benchmem ./benchmarks/micro
//	go test -modfile=go.upstream.mod -tags pristine -run x -bench . -benchmem ./benchmarks/micro
//
// Upstream v1.16.0's publish against a real broker measured 912 B/op and
// 29 allocs/op at every payload size (upstream-baseline.md, section D).
package micro

import (
	"bytes"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// TestMain fails the run if a benchmark leaves a goroutine behind: a
// connection's reader, a drain loop or a peer script. No broker is needed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sizes are the payloads of the baseline's micro-benchmark.
var sizes = []int{4, 43, 512, 4096, 16384}

// consumerTag is the tag the benchmark's consumer asks for, so that the
// peer can encode deliveries to it before the consumer exists.
const consumerTag = "bench"

// forEach runs bench as sub-benchmarks size=…/mode=… for every payload
// size and every read mode of the build.
func forEach(b *testing.B, bench func(b *testing.B, mode string, size int)) {
	for _, size := range sizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			for _, mode := range readmode.Modes() {
				b.Run("mode="+mode, func(b *testing.B) { bench(b, mode, size) })
			}
		})
	}
}

// BenchmarkPublish measures one PublishWithContext of the seed's
// properties (application/json, utf-8) and a payload of the given size:
// frame encoding, the write path of the mode, and the socket write. The
// connection's handshake, channel and close go to a fake peer, but while
// the benchmark is timed its writes are discarded by the connection itself
// (sinkConn): the peer parses every frame it reads into a fresh slice, and
// since the testing package counts the allocations of the whole process,
// letting it read the publishes would add its three allocations and the
// payload's size to every op. wire-B/op reports what was written.
func BenchmarkPublish(b *testing.B) {
	forEach(b, func(b *testing.B, mode string, size int) {
		p := fakepeer.Listen(b)
		// A script that returns at once leaves the peer answering
		// channel.open and the closes, and discarding the rest.
		p.Serve(func(*fakepeer.Session) error { return nil })
		var sink *sinkConn
		conn := dial(b, p, mode, func(c net.Conn) net.Conn {
			sink = &sinkConn{Conn: c}
			return sink
		})
		ch, err := conn.Channel()
		if err != nil {
			b.Fatalf("channel: %v", err)
		}
		msg := amqp.Publishing{ContentType: "application/json", ContentEncoding: "utf-8",
			Body: bytes.Repeat([]byte{'x'}, size)}

		sink.discard.Store(true)
		b.ReportAllocs()
		for b.Loop() {
			if err := ch.PublishWithContext(b.Context(), "", "bench", false, false, msg); err != nil {
				b.Fatalf("publish: %v", err)
			}
		}
		sink.discard.Store(false)
		b.ReportMetric(float64(sink.discarded.Load())/float64(b.N), "wire-B/op")
	})
}

// BenchmarkPublishConfirm is BenchmarkPublish on a channel in confirm
// mode, through PublishWithDeferredConfirmWithContext: the publish plus
// its confirm bookkeeping (a DeferredConfirmation per publish, which the
// library keeps until the broker confirms it; the fake peer never does, so
// the bookkeeping's map grows over the run and its growth counts too).
func BenchmarkPublishConfirm(b *testing.B) {
	forEach(b, func(b *testing.B, mode string, size int) {
		p := fakepeer.Listen(b)
		p.Serve(func(s *fakepeer.Session) error {
			ch, err := s.AnswerChannelOpen()
			if err != nil {
				return err
			}
			if _, err := s.ExpectMethod(ch, 85, 10); err != nil { // confirm.select
				return err
			}
			return s.Send(fakepeer.ConfirmSelectOk(ch))
		})
		var sink *sinkConn
		conn := dial(b, p, mode, func(c net.Conn) net.Conn {
			sink = &sinkConn{Conn: c}
			return sink
		})
		ch, err := conn.Channel()
		if err != nil {
			b.Fatalf("channel: %v", err)
		}
		if err := ch.Confirm(false); err != nil {
			b.Fatalf("confirm: %v", err)
		}
		msg := amqp.Publishing{ContentType: "application/json", ContentEncoding: "utf-8",
			Body: bytes.Repeat([]byte{'x'}, size)}

		sink.discard.Store(true)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ch.PublishWithDeferredConfirmWithContext(b.Context(), "", "bench", false, false, msg); err != nil {
				b.Fatalf("publish: %v", err)
			}
		}
		sink.discard.Store(false)
		b.ReportMetric(float64(sink.discarded.Load())/float64(b.N), "wire-B/op")
	})
}

// serveDeliveries has p answer channel.open and basic.consume, encode a
// basic.deliver with a payload of size once, close encoded, and, once
// release is closed, write it n times in chunks of many deliveries through
// SendSlices, which writes them as they are and so allocates nothing while
// the benchmark is timed.
func serveDeliveries(p *fakepeer.Peer, n, size int) (encoded, release chan struct{}) {
	encoded, release = make(chan struct{}), make(chan struct{})
	p.Serve(func(s *fakepeer.Session) error {
		ch, tag, err := s.AnswerChannelAndConsume()
		if err != nil {
			return err
		}
		one := fakepeer.BasicDeliver(ch, tag, 1, false, "", "bench",
			bytes.Repeat([]byte{'x'}, size), s.FrameMax())
		per := min(n, max(1, (256<<10)/len(one)))
		chunk := bytes.Repeat(one, per)
		close(encoded)
		select {
		case <-release:
		case <-s.Done():
			return nil
		}
		for sent := 0; sent < n; sent += per {
			k := min(per, n-sent) * len(one)
			if err := s.SendSlices(chunk[:k], k, 0); err != nil {
				return err
			}
		}
		return nil
	})
	return encoded, release
}

// BenchmarkDeliver measures one delivery of a payload of the given size to
// an autoAck consumer: frame reading and decoding, dispatch in the mode
// (through a DrainEvents loop in legacy mode, whose own allocations count),
// and the hand-over on the consumer's chan. The peer encodes a
// basic.deliver with its content once, and writes the same bytes b.N times,
// in chunks of many deliveries, through SendSlices, which writes them as
// they are and so allocates nothing while timed.
func BenchmarkDeliver(b *testing.B) {
	forEach(b, func(b *testing.B, mode string, size int) {
		n := b.N
		p := fakepeer.Listen(b)
		encoded, release := serveDeliveries(p, n, size)
		receiveTimed(b, dial(b, p, mode, nil), mode, n, encoded, release)
	})
}

// receiveTimed consumes from conn, in mode, the n deliveries that the peer
// (serveDeliveries) has encoded and sends once release is closed, timing
// only their reception.
func receiveTimed(b *testing.B, conn *amqp.Connection, mode string, n int, encoded, release chan struct{}) {
	b.Helper()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatalf("channel: %v", err)
	}
	deliveries, err := ch.Consume("bench", consumerTag, true, false, false, false, nil)
	if err != nil {
		b.Fatalf("consume: %v", err)
	}
	stop := scenario.StartDrainLoop(conn, mode, time.Second)
	defer stop()
	select {
	case <-encoded:
	case <-time.After(10 * time.Second): // the script failed; the peer reported why
		b.Fatal("the peer never encoded its deliveries")
	}

	b.ReportAllocs()
	b.ResetTimer()
	close(release)
	for i := range n {
		if _, ok := <-deliveries; !ok {
			b.Fatalf("deliveries closed after %d of %d", i, n)
		}
	}
	b.StopTimer()
}

// dial connects to p in mode, with heartbeats off (the peer sends none,
// and a timed loop must not race one), through wrap if it is not nil. The
// connection is closed before the peer shuts down.
func dial(b *testing.B, p *fakepeer.Peer, mode string, wrap func(net.Conn) net.Conn) *amqp.Connection {
	b.Helper()
	cfg := amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 5*time.Second)
		if err != nil || wrap == nil {
			return c, err
		}
		return wrap(c), nil
	}}
	conn, err := readmode.DialConfig(p.URL()+"?heartbeat=0", cfg, mode)
	if err != nil {
		b.Fatalf("dial %s: %v", mode, err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return conn
}

// sinkConn is a client's socket whose writes can be diverted: while discard
// is set they are counted and dropped instead of sent, as if to a peer that
// reads everything and allocates nothing.
type sinkConn struct {
	net.Conn
	discard   atomic.Bool
	discarded atomic.Int64
}

// Write sends p, or drops it while discard is set.
func (c *sinkConn) Write(p []byte) (int, error) {
	if c.discard.Load() {
		c.discarded.Add(int64(len(p)))
		return len(p), nil
	}
	return c.Conn.Write(p)
}
