package drainer_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// Tests here hold the contract of leader/follower reading (#29): a
// ConsumeFunc with nothing queued reads the socket itself, and the
// drainer takes the read back when its handler runs long.

// goroutineID is the running goroutine's id, read off its stack header.
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// readerSpy tells whether a ConsumeFunc read its own deliveries: the
// Observer's Delivered runs on the goroutine that read the frame.
type readerSpy struct {
	mu       sync.Mutex
	readBy   map[uint64]uint64 // delivery tag → goroutine that read it
	handler  atomic.Uint64     // the handler's goroutine
	selfRead atomic.Int64      // deliveries the handler's goroutine read
}

func newReaderSpy() *readerSpy { return &readerSpy{readBy: map[uint64]uint64{}} }

func (s *readerSpy) observer() *amqp.Observer {
	return &amqp.Observer{Delivered: func(d *amqp.Delivery) {
		s.mu.Lock()
		s.readBy[d.DeliveryTag] = goroutineID()
		s.mu.Unlock()
	}}
}

// handled records that the handler runs d, on its goroutine.
func (s *readerSpy) handled(d *amqp.Delivery) {
	id := goroutineID()
	s.handler.Store(id)
	s.mu.Lock()
	if s.readBy[d.DeliveryTag] == id {
		s.selfRead.Add(1)
	}
	s.mu.Unlock()
}

// awaitBlocked waits for the handler to block, and checks that the
// ConsumeFunc read some of the n deliveries before it: the lease was taken.
func (s *readerSpy) awaitBlocked(t *testing.T, blocked <-chan struct{}, done <-chan error, n int) {
	t.Helper()
	select {
	case <-blocked:
	case err := <-done:
		t.Fatalf("ConsumeFunc returned %v before its handler blocked", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never reached its blocking delivery")
	}
	if s.selfRead.Load() == 0 {
		t.Errorf("none of %d deliveries was read by the ConsumeFunc's goroutine: the lease was never taken", n)
	}
}

// publishConfirmed publishes n messages on a new confirming channel of
// conn, each confirmed before ctx ends, and returns the channel.
func publishConfirmed(t *testing.T, ctx context.Context, conn *amqp.Connection, key string, n int) *amqp.Channel {
	t.Helper()
	ch := testenv.Channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", key, false, false, amqp.Publishing{Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish %d on another channel not confirmed while a handler blocks: %v %v", i, ok, err)
		}
	}
	return ch
}

// TestLeaseHandlerBlockedStallsNobody: a ConsumeFunc on a prefetch of 1
// reads its own deliveries (the lease is taken); then its handler blocks.
// Meanwhile another channel's publishes are all confirmed, an RPC
// completes and the broker's heartbeats keep being read, so the
// connection lives; once released, the consumer goes on in order.
func TestLeaseHandlerBlockedStallsNobody(t *testing.T) {
	const n, blockAt = 60, 40
	spy := newReaderSpy()
	conn, err := drainerDial(testenv.AMQPURL(t), amqp.Config{Heartbeat: time.Second},
		drainer.Options{Observer: spy.observer()})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	chA := testenv.Channel(t, conn)
	q := pooledQueue(t, chA, n, 64)
	if err := chA.Qos(1, 0, false); err != nil { // one in flight: each delivery waits for an ack
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	blocked, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	handled := 0
	go func() {
		done <- chA.ConsumeFunc(ctx, q, amqp.ConsumeFuncOptions{}, func(d *amqp.Delivery) error {
			spy.handled(d)
			if !bytes.Equal(d.Body, pooledBody(handled, 64)) {
				t.Errorf("delivery %d: body %.20q…, out of order", handled, d.Body)
			}
			handled++
			if handled == blockAt {
				close(blocked)
				<-release
			}
			if handled == n {
				cancel()
			}
			return d.Ack(false)
		})
	}()
	spy.awaitBlocked(t, blocked, done, blockAt)

	// The handler blocks: another channel's confirms, an RPC and the heartbeats still flow.
	bounded, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	chB := publishConfirmed(t, bounded, conn, q+"-none", 50)
	if _, err := chB.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
		t.Fatalf("an RPC while a handler blocks: %v", err)
	}
	// Only the broker's heartbeats arrive now: three read prove a reader.
	frames := conn.Stats().FramesIn
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for conn.Stats().FramesIn < frames+3 {
		select {
		case <-tick.C:
		case <-bounded.Done():
			t.Fatalf("frames read while the handler blocks: %d, want 3 heartbeats", conn.Stats().FramesIn-frames)
		}
	}
	if conn.IsClosed() {
		t.Fatal("the connection closed while a handler blocked")
	}

	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ConsumeFunc returned %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ConsumeFunc did not finish after its handler was released")
	}
	if handled != n {
		t.Fatalf("handled %d deliveries, want %d", handled, n)
	}
}

// TestLeaseHandlerBlockedForeverWhileAnotherChannelConfirms: the fake
// peer paces deliveries on one ack each, so the ConsumeFunc takes the
// read; its handler then blocks for the rest of the test, while another
// channel publishes with confirms and every confirm comes back.
func TestLeaseHandlerBlockedForeverWhileAnotherChannelConfirms(t *testing.T) {
	const paced, published = 30, 20
	peer := fakepeer.Listen(t)
	peer.Serve(func(s *fakepeer.Session) error {
		ch, tag, err := s.AnswerChannelAndConsume()
		if err != nil {
			return err
		}
		for i := 1; i <= paced; i++ {
			if err := s.Send(fakepeer.BasicDeliver(ch, tag, uint64(i), false, "", "q", []byte(strconv.Itoa(i)), s.FrameMax())); err != nil {
				return err
			}
			if i < paced { // the last one's handler never returns
				if _, err := s.ExpectMethod(ch, 60, 80); err != nil { // basic.ack
					return err
				}
			}
		}
		ch2, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		if _, err := s.ExpectMethod(ch2, 85, 10); err != nil { // confirm.select
			return err
		}
		if err := s.Send(fakepeer.ConfirmSelectOk(ch2)); err != nil {
			return err
		}
		for tag := uint64(1); tag <= published; {
			f, err := s.ReadFrame()
			if err != nil {
				return err
			}
			if c, m := f.Method(); f.Type == fakepeer.FrameMethod && c == 60 && m == 40 { // basic.publish
				if err := s.Send(fakepeer.BasicAck(ch2, tag, false)); err != nil {
					return err
				}
				tag++
			}
		}
		return nil
	})

	spy := newReaderSpy()
	conn, err := drainerDial(peer.URL(), amqp.Config{}, drainer.Options{Observer: spy.observer()})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch := testenv.Channel(t, conn)
	blocked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		next := 1
		done <- ch.ConsumeFunc(ctx, "q", amqp.ConsumeFuncOptions{}, func(d *amqp.Delivery) error {
			spy.handled(d)
			if string(d.Body) != strconv.Itoa(next) {
				t.Errorf("delivery %q, want %d: out of order", d.Body, next)
			}
			if next++; next > paced {
				close(blocked)
				<-release
				return nil
			}
			return d.Ack(false)
		})
	}()
	spy.awaitBlocked(t, blocked, done, paced)
	bounded, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	publishConfirmed(t, bounded, conn, "q2", published)
	// The peer answers no basic.cancel: the consumer ends with the connection.
	unblock()
	_ = conn.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("ConsumeFunc did not end with its connection")
	}
}
