package brokerfaults

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// TestPublishWithContextWaitsOutABlock: after connection.blocked, a
// PublishWithContext in drainer or legacy mode waits, writing nothing,
// and returns when its ctx ends, leaving the connection intact; after
// connection.unblocked it goes through. Upstream mode, the default, keeps
// upstream's behaviour: the publish is written whatever the broker said.
//
// A fake peer plays the broker, because RabbitMQ blocks a connection only
// when it publishes during an alarm (TestMemoryAlarm covers that), and
// stops reading it then, which hides whether the client held the publish
// back or the socket did.
func TestPublishWithContextWaitsOutABlock(t *testing.T) {
	level.Require(t)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			verifyNoLeaks(t)
			published := make(chan int, 1)
			peer := fakepeer.Listen(t)
			peer.Serve(func(s *fakepeer.Session) error {
				return playBlockingBroker(s, published)
			})
			conn, err := compat.DialConfig(peer.URL(), amqp.Config{}, mode)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			drained := drainLoop(t, conn, mode)
			blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 2))
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			// The peer sends connection.blocked ahead of this reply.
			if _, err := ch.QueueDeclare("block", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			start := time.Now()
			heldErr := ch.PublishWithContext(ctx, "", "q", false, false, amqp.Publishing{Body: []byte("held")})
			cancel()
			took := time.Since(start)
			if mode == compat.Upstream {
				if heldErr != nil {
					t.Fatalf("upstream mode: PublishWithContext while blocked = %v, want nil (written, as upstream)", heldErr)
				}
			} else {
				if !errors.Is(heldErr, context.DeadlineExceeded) {
					t.Fatalf("PublishWithContext while blocked = %v, want context.DeadlineExceeded", heldErr)
				}
				if took > bound {
					t.Fatalf("PublishWithContext while blocked took %v, over %v", took, bound)
				}
			}

			if _, err := ch.QueueDeclare("unblock", false, false, false, false, nil); err != nil {
				t.Fatalf("an RPC after the held publish: %v", err)
			}
			ctx, cancel = context.WithTimeout(context.Background(), bound)
			err = ch.PublishWithContext(ctx, "", "q", false, false, amqp.Publishing{Body: []byte("after")})
			cancel()
			if err != nil {
				t.Fatalf("PublishWithContext after connection.unblocked: %v", err)
			}
			if err := conn.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := drained(); err != nil && !errors.Is(err, amqp.ErrClosedIntentionally) {
				t.Fatalf("drain loop: %v", err)
			}
			want := 1
			if mode == compat.Upstream {
				want = 2
			}
			if got := <-published; got != want {
				t.Fatalf("the peer read %d basic.publish, want %d", got, want)
			}
			for _, active := range []bool{true, false} {
				select {
				case b := <-blocks:
					if b.Active != active {
						t.Fatalf("NotifyBlocked gave Active=%v, want %v", b.Active, active)
					}
				default:
					t.Fatalf("NotifyBlocked missed Active=%v", active)
				}
			}
			t.Logf("%s: publish while blocked returned %v after %s", mode, heldErr, ms(took))
		})
	}
}

// playBlockingBroker answers channel.open, then queue.declare "block"
// with connection.blocked and the reply, and "unblock" with
// connection.unblocked and the reply; it counts basic.publish until the
// client closes, and reports the count on published.
func playBlockingBroker(s *fakepeer.Session, published chan<- int) error {
	ch, err := s.AnswerChannelOpen()
	if err != nil {
		return err
	}
	publishes := 0
	defer func() { published <- publishes }()
	for {
		f, err := s.ReadFrame()
		if err != nil {
			return err
		}
		if f.Type != fakepeer.FrameMethod {
			continue
		}
		switch class, method := f.Method(); {
		case class == 50 && method == 10: // queue.declare
			a := fakepeer.ReadArgs(f.Args())
			a.Short() // reserved-1
			notice := fakepeer.ConnectionUnblocked()
			if a.ShortStr() == "block" {
				notice = fakepeer.ConnectionBlocked("low on memory")
			}
			if err := s.Send(notice, fakepeer.QueueDeclareOk(ch, "q", 0, 0)); err != nil {
				return err
			}
		case class == 60 && method == 40: // basic.publish
			publishes++
		case class == 20 && method == 40: // channel.close
			if err := s.Send(fakepeer.ChannelCloseOk(f.Channel)); err != nil {
				return err
			}
		case class == 10 && method == 50: // connection.close
			return s.Send(fakepeer.ConnectionCloseOk())
		}
	}
}
