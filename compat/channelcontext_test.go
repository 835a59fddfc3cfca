package compat_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
)

// TestChannelWithContextBlackhole opens a connection through Toxiproxy,
// then makes the link swallow everything the client sends (a timeout
// toxic with timeout 0: no reset, no reply) and opens a channel with a
// 300 ms deadline. ChannelWithContext must return at its deadline with an
// *amqp.RPCError matching context.DeadlineExceeded, leave the connection
// open, and the connection must then close within its ctx.
func TestChannelWithContextBlackhole(t *testing.T) {
	const deadline = 300 * time.Millisecond
	for _, mode := range []compat.Mode{compat.Upstream, compat.Drainer, compat.Legacy, compat.LegacyAutoDrain} {
		t.Run(mode.String(), func(t *testing.T) {
			p := toxi.NewProxy(t, testenv.AMQPAddr(t))
			conn, err := compat.Dial(p.URL(), mode)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			if mode == compat.Legacy {
				stop := drainWhileOpen(conn)
				t.Cleanup(stop)
			}

			toxic := p.Timeout(toxi.Upstream, 0)
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			end, _ := ctx.Deadline()
			ch, err := conn.ChannelWithContext(ctx)
			late := time.Since(end)
			t.Logf("%v: ChannelWithContext through a blackhole returned %.1f ms past its %v deadline: %v",
				mode, float64(late.Microseconds())/1000, deadline, err)
			var rpcErr *amqp.RPCError
			switch {
			case err == nil:
				_ = ch.Close()
				t.Fatalf("ChannelWithContext succeeded through a blackhole")
			case !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &rpcErr):
				t.Fatalf("got %v, want an *amqp.RPCError matching context.DeadlineExceeded", err)
			case late > 2*time.Second:
				t.Errorf("returned %v past its deadline, want promptly", late)
			}
			if conn.IsClosed() {
				t.Fatalf("the connection closed: an abandoned channel.open must leave it open")
			}

			// Toxiproxy ends the link when the toxic goes, so what is left
			// to check is that the connection still closes in bounded time.
			p.RemoveToxic(toxic)
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			err = conn.CloseWithContext(ctx)
			if took := time.Since(start); took > 6*time.Second {
				t.Errorf("CloseWithContext took %v (%v), want within its 5 s ctx", took, err)
			}
		})
	}
}

// drainWhileOpen runs a legacy application's drain loop until the
// connection ends; the returned func closes the connection and waits for
// the loop.
func drainWhileOpen(conn *amqp.Connection) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			err := conn.DrainEvents(ctx)
			cancel()
			if conn.IsClosed() || (err != nil && !errors.Is(err, context.DeadlineExceeded)) {
				return
			}
		}
	}()
	return func() {
		_ = conn.Close()
		<-done
	}
}
