// The broker discovery (internal/testenv) is the patched build's: the
// pristine A/B build compiles this package, not its tests.

//go:build !pristine

package rawdrain

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// reads are the ways Drain reads its socket: the netpoller (go-floor)
// and the blocking read(2) of issue #40, told of and not (the
// go-floor-blocking and go-floor-rawsyscall variants).
var reads = []Read{Netpoll, Blocking, BlockingRaw}

// TestDrainReceivesEveryDelivery drains a queue that a client filled, in
// each read mode, and checks that every message was received and acked:
// the queue ends empty with nothing unacknowledged.
func TestDrainReceivesEveryDelivery(t *testing.T) {
	url := testenv.AMQPURL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, read := range reads {
		t.Run(read.String(), func(t *testing.T) {
			// Not auto-delete: the queue must outlive the drain's
			// consumer, to be inspected after it.
			q, err := ch.QueueDeclare("", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ch.QueueDelete(q.Name, false, false, false)
			const n = 1234 // not a multiple of the ack interval: the last ack is the remainder's
			for i := range n {
				body := make([]byte, i%300) // empty bodies too: no body frame at all
				if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: body}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			started := false
			cfg := Config{URL: url, Queue: q.Name, N: n, Prefetch: 100, AckEvery: 100, Read: read}
			got, err := Drain(ctx, cfg, func() { started = true })
			if err != nil || got != n || !started {
				t.Fatalf("Drain = %d, %v (started %v); want %d, nil", got, err, started, n)
			}
			// The drain's connection closed cleanly: anything unacked
			// would be back in the queue now.
			left, err := ch.QueueDeclarePassive(q.Name, false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			if left.Messages != 0 {
				t.Fatalf("%d messages left in the queue after draining all %d", left.Messages, n)
			}
		})
	}
}

// TestDrainEndsWithItsContext drains an empty queue in each read mode
// until ctx's deadline: a read that nothing will ever answer must end,
// with the deadline in the error. A blocking read obeys no deadline of
// the net package's; shutdown(2) ends it.
func TestDrainEndsWithItsContext(t *testing.T) {
	url := testenv.AMQPURL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// Neither exclusive nor auto-delete: the drains consume it from
	// connections of their own, one after another.
	q, err := ch.QueueDeclare("", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.QueueDelete(q.Name, false, false, false)
	for _, read := range reads {
		t.Run(read.String(), func(t *testing.T) {
			// The deadline is what is tested, not a wait for something:
			// whether it expires before the read blocks or during it, the
			// drain must end with it.
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			cfg := Config{URL: url, Queue: q.Name, N: 1, Prefetch: 1, AckEvery: 1, Read: read}
			got, err := Drain(ctx, cfg, func() {})
			if got != 0 || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Drain of an empty queue = %d, %v; want 0, the deadline", got, err)
			}
		})
	}
}

// TestDrainReportsTheBrokersRefusal checks, in each read mode, that a
// method the drain does not expect, here the broker closing the channel
// for a queue that does not exist, ends it with the broker's reply.
func TestDrainReportsTheBrokersRefusal(t *testing.T) {
	for _, read := range reads {
		t.Run(read.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := Config{URL: testenv.AMQPURL(t), Queue: "rawdrain-no-such-queue", N: 1, Prefetch: 1,
				AckEvery: 1, Read: read}
			_, err := Drain(ctx, cfg, func() {})
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte("404")) {
				t.Fatalf("Drain of a missing queue: %v; want the broker's 404", err)
			}
		})
	}
}

// frameBytes encodes one frame.
func frameBytes(typ byte, channel uint16, payload []byte) []byte {
	b := []byte{typ, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(b[1:], channel)
	binary.BigEndian.PutUint32(b[3:], uint32(len(payload)))
	return append(append(b, payload...), frameEnd)
}

// consumeThenDeliver is consume-ok and one delivery of a 3-byte body.
func consumeThenDeliver() []byte {
	var b []byte
	b = append(b, frameBytes(frameMethod, 1, []byte{0, 60, 0, 21, 1, 'x'})...)
	deliver := []byte{0, 60, 0, 60, 1, 'x', 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0}
	b = append(b, frameBytes(frameMethod, 1, deliver)...)
	b = append(b, frameBytes(frameHeader, 1, []byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0})...)
	return append(b, frameBytes(frameBody, 1, []byte("abc"))...)
}

// drainBytes runs the drain loop against in, the broker's side after
// basic.consume, and returns what it received.
func drainBytes(in []byte, n int) (int, error) {
	s := &session{frames: NewFrames(bytes.NewReader(in), 4096), w: bufio.NewWriter(io.Discard)}
	return s.drain("q", n, 1)
}

func TestDrainCountsContentAndRejectsMalformedFrames(t *testing.T) {
	if got, err := drainBytes(consumeThenDeliver(), 1); got != 1 || err != nil {
		t.Fatalf("a whole delivery: %d, %v", got, err)
	}
	bad := consumeThenDeliver()
	bad[len(bad)-1] = 0 // frame-end
	if _, err := drainBytes(bad, 1); !errors.Is(err, ErrFrame) {
		t.Fatalf("bad frame-end: %v; want ErrFrame", err)
	}
	huge := frameBytes(frameBody, 1, make([]byte, 5000))
	if _, err := drainBytes(huge, 1); !errors.Is(err, ErrFrame) {
		t.Fatalf("a frame above frame-max: %v; want ErrFrame", err)
	}
}

// FuzzDrain feeds the drain loop arbitrary broker bytes after
// basic.consume: it must end with a count or an error, never a panic.
func FuzzDrain(f *testing.F) {
	f.Add(consumeThenDeliver(), uint8(1))
	f.Add(consumeThenDeliver()[:20], uint8(2))
	f.Fuzz(func(t *testing.T, in []byte, n uint8) {
		got, err := drainBytes(in, int(n)+1)
		if err == nil && got != int(n)+1 {
			t.Fatalf("no error but %d of %d deliveries", got, int(n)+1)
		}
	})
}
