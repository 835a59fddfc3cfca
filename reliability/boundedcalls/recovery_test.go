package boundedcalls

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// TestAbandonedChannelThenRecovery abandons a channel on a connection with
// upstream's automatic recovery on, and has the peer reset the connection
// while the channel's stand-in still waits for its close-ok. The stand-in
// must be gone before recovery reopens the connection's channels (a
// stand-in is closed for good, and one left registered would fail every
// recovery attempt), so recovery succeeds, reopens no channel for the
// abandoned one, and the recovered connection opens a new channel.
func TestAbandonedChannelThenRecovery(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			verifyNoLeaks(t)
			peer := fakepeer.Listen(t, fakepeer.WithIOTimeout(ioTimeout))
			abandoned := make(chan struct{})
			peer.Serve(func(s *fakepeer.Session) error {
				ch, err := s.AnswerChannelOpen()
				if err != nil {
					return err
				}
				if _, err := s.ExpectMethod(ch, classQueue, 10); err != nil { // queue.declare: never answered
					return err
				}
				if _, err := s.ExpectMethod(ch, classChannel, mChannelClose); err != nil { // the stand-in's close
					return err
				}
				close(abandoned)
				return s.Reset() // no close-ok: the connection dies under the stand-in
			})
			// The recovered connection: the peer answers channel.open and
			// the closes, and nothing else is expected of it.
			reopened := make(chan uint16, 8)
			peer.Serve(func(s *fakepeer.Session) error {
				ch, err := s.AnswerChannelOpen()
				if err != nil {
					return err
				}
				reopened <- ch
				return nil
			})

			cfg := amqp.Config{Recovery: &amqp.Recovery{
				ReconnectionConfig:   &amqp.ReconnectionConfig{MaxRetryCount: 5, RetryInterval: 50 * time.Millisecond},
				TopologyRecoveryMode: amqp.TopologyRecoveryDisabled,
			}}
			conn, err := compat.DialConfig(peer.URL(), cfg, mode)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			states := make(chan *amqp.StateChanged, 16)
			conn.NotifyStateChange(states)
			if mode == compat.Legacy {
				drainThroughRecovery(t, conn)
			}

			ch, err := conn.Channel()
			if err != nil {
				t.Fatalf("channel: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			_, err = ch.QueueDeclareWithContext(ctx, "never", false, false, false, false, nil)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, amqp.ErrClosed) {
				t.Fatalf("QueueDeclareWithContext: %v, want the abandoned call's error", err)
			}
			select {
			case <-abandoned:
			case <-time.After(bound):
				t.Fatalf("the stand-in's channel.close did not reach the peer within %v", bound)
			}

			// Recovery: Reconnecting, then Open again.
			timeout := time.After(bound + 10*time.Second)
			for recovered := false; !recovered; {
				select {
				case sc := <-states:
					if sc.To == amqp.StateClosed {
						t.Fatalf("recovery failed: %v", sc.Err)
					}
					recovered = sc.From == amqp.StateReconnecting && sc.To == amqp.StateOpen
				case <-timeout:
					t.Fatalf("the connection did not recover")
				}
			}
			select {
			case id := <-reopened:
				t.Fatalf("recovery reopened channel %d: the abandoned channel or its stand-in was still registered", id)
			default:
			}

			ctx, cancel = context.WithTimeout(context.Background(), bound)
			defer cancel()
			fresh, err := conn.ChannelWithContext(ctx)
			if err != nil {
				t.Fatalf("a new channel after recovery: %v", err)
			}
			select {
			case <-reopened:
			case <-time.After(bound):
				t.Fatalf("the peer did not see the new channel's open")
			}
			if err := fresh.CloseWithContext(ctx); err != nil {
				t.Errorf("closing the new channel: %v", err)
			}
			if err := conn.CloseWithContext(ctx); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

// drainThroughRecovery is a legacy application's drain loop that carries
// on across a recovery: DrainEvents fails at once while the connection is
// down, so the loop paces its retries until the new generation is up. It
// stops at Close (ErrClosedIntentionally) or when the test ends.
func drainThroughRecovery(t *testing.T, conn *amqp.Connection) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		pace := time.NewTicker(5 * time.Millisecond)
		defer pace.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			err := conn.DrainEvents(ctx)
			cancel()
			if errors.Is(err, amqp.ErrClosedIntentionally) {
				return
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				select { // down, between generations
				case <-stop:
					return
				case <-pace.C:
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		_ = conn.Close()
		<-done
	})
}
