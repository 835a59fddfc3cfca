package brokerfaults

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// rpcDeadline is the deadline of the RPCs made while the broker does not
// read the connection.
const rpcDeadline = 500 * time.Millisecond

// TestBoundedCallsUnderMemoryAlarm makes a live broker stop answering a
// healthy connection, the case heartbeats cannot see: under a memory alarm
// RabbitMQ stops reading a connection once it publishes, but keeps its
// socket open and keeps sending heartbeats. A QueueDeclareWithContext and
// a ConfirmWithContext on two channels of that connection must each
// return at their deadline with an error matching context.DeadlineExceeded
// and ErrClosed, their channels closed and the connection left open; once
// the alarm is lifted, the broker answers the abandoned requests and the
// client's channel.close (the stand-ins drop the late replies), and a new
// channel on the same connection works.
func TestBoundedCallsUnderMemoryAlarm(t *testing.T) {
	level.Require(t)
	api := newMgmt(t)
	c := needCtl(t, api)
	restore := c.watermarkArgs(t)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			verifyNoLeaks(t)
			a := &alarm{ctl: c, restore: restore}
			p := openPublisher(t, mode, "bounded")
			declareCh := testenv.Channel(t, p.conn)
			confirmCh := testenv.Channel(t, p.conn)

			a.raise(t)
			// The publish is what makes the broker block the connection
			// and stop reading it.
			if err := p.publish(context.Background(), []byte("under the alarm")); err != nil {
				a.fatalf(t, "a publish under the alarm: %v", err)
			}
			if err := p.awaitBlocking(true); err != nil {
				a.fatalf(t, "%v", err)
			}

			type outcome struct {
				what string
				err  error
				late time.Duration // past the deadline
			}
			calls := []struct {
				what string
				ch   *amqp.Channel
				call func(ctx context.Context, ch *amqp.Channel) error
			}{
				{"QueueDeclareWithContext", declareCh, func(ctx context.Context, ch *amqp.Channel) error {
					_, err := ch.QueueDeclareWithContext(ctx, "", false, true, true, false, nil)
					return err
				}},
				{"ConfirmWithContext", confirmCh, func(ctx context.Context, ch *amqp.Channel) error {
					return ch.ConfirmWithContext(ctx, false)
				}},
			}
			results := make(chan outcome, len(calls))
			for _, call := range calls {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), rpcDeadline)
					defer cancel()
					deadline, _ := ctx.Deadline()
					err := call.call(ctx, call.ch)
					results <- outcome{call.what, err, time.Since(deadline)}
				}()
			}
			for range calls {
				var r outcome
				select {
				case r = <-results:
				case <-time.After(rpcDeadline + bound):
					a.fatalf(t, "a bounded call under the alarm did not return within %v of its %v deadline", bound, rpcDeadline)
				}
				t.Logf("%s under the alarm: returned %s past its %v deadline: %v", r.what, ms(r.late), rpcDeadline, r.err)
				var rpcErr *amqp.RPCError
				switch {
				case !errors.Is(r.err, context.DeadlineExceeded) || !errors.Is(r.err, amqp.ErrClosed) || !errors.As(r.err, &rpcErr):
					t.Errorf("%s: got %v, want an *amqp.RPCError matching context.DeadlineExceeded and amqp.ErrClosed", r.what, r.err)
				case r.late > 2*time.Second:
					t.Errorf("%s returned %s past its deadline, want promptly", r.what, ms(r.late))
				}
			}
			for _, call := range calls {
				if !call.ch.IsClosed() {
					t.Errorf("%s: the channel is still open after the abandoned call", call.what)
				}
			}
			if p.conn.IsClosed() {
				a.fatalf(t, "the connection closed: abandoning a channel's call must leave it open")
			}

			if err := a.lift(); err != nil {
				t.Fatalf("lifting the memory alarm: %v", err)
			}
			if err := p.awaitBlocking(false); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			ch, err := p.conn.ChannelWithContext(ctx)
			if err != nil {
				t.Fatalf("a new channel after the alarm: %v", err)
			}
			q, err := ch.QueueDeclareWithContext(ctx, "", false, true, true, false, nil)
			if err != nil {
				t.Fatalf("QueueDeclareWithContext on the new channel: %v", err)
			}
			if err := ch.ConfirmWithContext(ctx, false); err != nil {
				t.Fatalf("ConfirmWithContext on the new channel: %v", err)
			}
			if _, err := ch.QueueDeleteWithContext(ctx, q.Name, false, false, false); err != nil {
				t.Fatalf("QueueDeleteWithContext on the new channel: %v", err)
			}
			if err := ch.CloseWithContext(ctx); err != nil {
				t.Fatalf("CloseWithContext: %v", err)
			}
			if err := p.conn.CloseWithContext(ctx); err != nil {
				t.Fatalf("Connection.CloseWithContext: %v", err)
			}
			if err := p.drained(); err != nil && !errors.Is(err, amqp.ErrClosed) {
				t.Errorf("drain loop: %v", err)
			}
		})
	}
}
