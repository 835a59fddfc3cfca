package drainer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// Tests here script the broker with the fake peer: RabbitMQ cannot be made
// to send channel.flow, or to stop reading on cue.

// TestUnreadFlowAndBlockedListenersStallNobody: the peer sends 50
// connection.blocked/unblocked and 50 channel.flow to listeners nobody
// reads, then answers an RPC. The RPC completes at once, every flow-ok is
// written, and the listeners later receive every notification in order.
func TestUnreadFlowAndBlockedListenersStallNobody(t *testing.T) {
	const n = 50
	peer := fakepeer.Listen(t)
	peer.Serve(func(s *fakepeer.Session) error {
		ch, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		// The client declares "ready" once its listeners are registered;
		// the notifications go out ahead of the reply to that declare.
		if _, err := s.ExpectMethod(ch, 50, 10); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			blocked := fakepeer.ConnectionBlocked(fmt.Sprint("low memory ", i))
			if i%2 == 1 {
				blocked = fakepeer.ConnectionUnblocked()
			}
			if err := s.Send(blocked, fakepeer.ChannelFlow(ch, i%2 == 0)); err != nil {
				return err
			}
		}
		if err := s.Send(fakepeer.QueueDeclareOk(ch, "ready", 0, 0)); err != nil {
			return err
		}
		for flowOks := 0; flowOks < n; {
			f, err := s.ReadFrame()
			if err != nil {
				return err
			}
			if class, method := f.Method(); f.Type == fakepeer.FrameMethod && class == 20 && method == 21 {
				flowOks++
			}
		}
		return s.AnswerClose()
	})

	conn := dial(t, peer.URL(), amqp.Config{})
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking))
	ch := testenv.Channel(t, conn)
	flows := ch.NotifyFlow(make(chan bool))

	start := time.Now()
	if _, err := ch.QueueDeclare("ready", false, false, true, false, nil); err != nil {
		t.Fatalf("QueueDeclare behind unread listeners: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("QueueDeclare took %s behind unread listeners, want under 1s", d)
	}
	for i := 0; i < n; i++ {
		select {
		case b := <-blocks:
			if b.Active != (i%2 == 0) {
				t.Fatalf("blocked notification %d = %+v, out of order", i, b)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("blocked notification %d of %d never arrived", i, n)
		}
		select {
		case active := <-flows:
			if active != (i%2 == 0) {
				t.Fatalf("flow notification %d = %v, out of order", i, active)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("flow notification %d of %d never arrived", i, n)
		}
	}
}

// writeWatcher is a net.Conn that reports once a given number of bytes
// has been written through it.
type writeWatcher struct {
	net.Conn
	written   atomic.Int64
	threshold int64
	once      sync.Once
	reached   chan struct{}
}

func (w *writeWatcher) Write(p []byte) (int, error) {
	if w.written.Add(int64(len(p))) >= w.threshold {
		w.once.Do(func() { close(w.reached) })
	}
	return w.Conn.Write(p)
}

// TestCloseIsBoundedWhenTheBrokerStopsReading: a publisher is stuck in a
// socket write because the peer stopped reading. Close still returns
// within its bound, and frees the publisher.
func TestCloseIsBoundedWhenTheBrokerStopsReading(t *testing.T) {
	peer := fakepeer.Listen(t)
	peer.Serve(func(s *fakepeer.Session) error {
		if _, err := s.AnswerChannelOpen(); err != nil {
			return err
		}
		return s.StopReading()
	})

	watch := &writeWatcher{threshold: 1 << 20, reached: make(chan struct{})}
	cfg := amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.Dial(network, addr)
		watch.Conn = c
		return watch, err
	}}
	const closeTimeout = time.Second
	conn, err := drainerDial(peer.URL(), cfg, drainer.Options{CloseTimeout: closeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	ch := testenv.Channel(t, conn)

	published := make(chan error, 1)
	go func() {
		// Far more than the socket buffers hold: this write blocks.
		body := make([]byte, 64<<20)
		published <- ch.PublishWithContext(context.Background(), "", "q", false, false, amqp.Publishing{Body: body})
	}()
	select {
	case <-watch.reached:
	case err := <-published:
		t.Fatalf("the publish finished although the peer is not reading: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the publisher never started writing")
	}

	start := time.Now()
	closeErr := conn.Close()
	elapsed := time.Since(start)
	t.Logf("Close returned after %s: %v", elapsed, closeErr)
	if elapsed > closeTimeout+2*time.Second {
		t.Fatalf("Close took %s, want within its %s bound (plus slack)", elapsed, closeTimeout)
	}
	if closeErr == nil {
		t.Fatal("Close reported success although the broker never answered close-ok")
	}
	select {
	case err := <-published:
		if err == nil {
			t.Fatal("the blocked publish reported success")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the blocked publisher was not freed by Close")
	}
}

// TestCloseUnderLoad closes 50 connections, each with an active consumer
// and an active publisher, and wants every Close back within 2 s and every
// goroutine gone (the leak check in TestMain). A broker under load may
// answer close-ok late, behind the publishes queued ahead of the close:
// with a 1 s CloseTimeout, Close then gives up on it, says so, and is still
// within the bound.
func TestCloseUnderLoad(t *testing.T) {
	const trials = 50
	var times []time.Duration
	timedOut := 0
	for i := 0; i < trials; i++ {
		conn, err := drainerDial(brokerURL(t), amqp.Config{}, drainer.Options{CloseTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		consumerCh, publisherCh := testenv.Channel(t, conn), testenv.Channel(t, conn)
		q := testenv.ExclusiveQueue(t, consumerCh)
		deliveries, err := consumerCh.Consume(q, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		got := make(chan struct{}, 1)
		go func() {
			defer wg.Done()
			for range deliveries {
				select {
				case got <- struct{}{}:
				default:
				}
			}
		}()
		go func() {
			defer wg.Done()
			for {
				if err := publisherCh.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte("load")}); err != nil {
					return
				}
			}
		}()
		select {
		case <-got: // both are running
		case <-time.After(10 * time.Second):
			t.Fatal("the consumer never received anything")
		}

		start := time.Now()
		err = conn.Close()
		d := time.Since(start)
		switch {
		case err == nil, errors.Is(err, amqp.ErrClosed):
		case strings.Contains(err.Error(), "close-ok not received within"), errors.Is(err, net.ErrClosed):
			timedOut++ // the watchdog closed the socket: bounded, and said so
		default:
			t.Fatalf("trial %d: Close = %v", i, err)
		}
		times = append(times, d)
		if d > 2*time.Second {
			t.Fatalf("trial %d: Close took %s, want within 2s", i, d)
		}
		wg.Wait()
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	t.Logf("%d closes under load: P50 %s, P95 %s, max %s; %d gave up waiting for close-ok", trials,
		times[trials/2], times[trials*95/100], times[trials-1], timedOut)
}

// TestBadFramesCloseTheConnectionWithAReason: an oversized frame and a
// malformed one each close the connection with a FrameError (501) whose
// reason says what was wrong; nothing panics and nothing leaks.
func TestBadFramesCloseTheConnectionWithAReason(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		frame      func(frameMax uint32) []byte
	}{
		{"oversized", "exceeds the frame maximum", func(frameMax uint32) []byte {
			return fakepeer.RawFrame(fakepeer.FrameBody, 1, make([]byte, frameMax))
		}},
		{"bad frame-end", "frame-end octet", func(uint32) []byte {
			f := fakepeer.HeartbeatFrame()
			f[len(f)-1] = 0
			return f
		}},
		{"unknown frame type", "invalid frame type", func(uint32) []byte {
			return fakepeer.RawFrame(42, 0, nil)
		}},
		{"garbled method", "malformed frame", func(uint32) []byte {
			return fakepeer.MethodFrame(1, 60, 0xFFFF, []byte{1, 2, 3})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := fakepeer.Listen(t)
			peer.Serve(func(s *fakepeer.Session) error {
				if _, err := s.AnswerChannelOpen(); err != nil {
					return err
				}
				if err := s.Send(tc.frame(s.FrameMax())); err != nil {
					return err
				}
				<-s.Done()
				return nil
			})
			conn := dial(t, peer.URL(), amqp.Config{})
			closed := conn.NotifyClose(make(chan *amqp.Error, 1))
			// The bad frame follows channel.open-ok at once: the channel
			// may or may not open before the connection goes.
			_, _ = conn.Channel()
			select {
			case err := <-closed:
				if err == nil || err.Code != amqp.FrameError || !strings.Contains(err.Reason, tc.want) {
					t.Fatalf("close error = %v, want a FrameError saying %q", err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the connection survived a bad frame")
			}
		})
	}
}

// TestProtocolErrorIsNotAnIntentionalClose: a content header on channel 0
// makes the client close the connection itself (505 UNEXPECTED_FRAME).
// That close is the library's, not the application's: a waiter sees the
// 505, not ErrClosedIntentionally.
func TestProtocolErrorIsNotAnIntentionalClose(t *testing.T) {
	peer := fakepeer.Listen(t)
	ready := make(chan struct{})
	peer.Serve(func(s *fakepeer.Session) error {
		<-ready
		if err := s.Send(fakepeer.HeaderFrame(0, 60, 0, 0, nil)); err != nil {
			return err
		}
		return s.AnswerClose()
	})
	conn := dial(t, peer.URL(), amqp.Config{})
	drained := make(chan error, 1)
	go func() {
		for {
			if err := conn.DrainEvents(context.Background()); err != nil {
				drained <- err
				return
			}
		}
	}()
	close(ready)
	select {
	case err := <-drained:
		var amqpErr *amqp.Error
		if errors.Is(err, amqp.ErrClosedIntentionally) || !errors.As(err, &amqpErr) || amqpErr.Code != amqp.UnexpectedFrame {
			t.Fatalf("DrainEvents after a protocol error = %v, want the 505 UNEXPECTED_FRAME", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the protocol error did not end the connection")
	}
}
