package boundedcalls

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// scope says what the client must close when a call is abandoned, and so
// how the peer script goes on.
type scope int

const (
	onChannel    scope = iota // a method of an open channel: the client closes the channel
	channelOpen               // Connection.ChannelWithContext: channel.open unanswered
	channelClose              // Channel.CloseWithContext: channel.close-ok withheld
	connLevel                 // Connection.UpdateSecretWithContext: the client closes the connection
	connClose                 // Connection.CloseWithContext: connection.close-ok withheld
)

// rpcCase is one synchronous method with a reply.
type rpcCase struct {
	name          string
	scope         scope
	class, method uint16 // the request the peer leaves unanswered
	// setup runs on the client's channel before the call, and
	// answerSetup is the peer's side of it.
	setup       func(ctx context.Context, ch *amqp.Channel) error
	answerSetup func(s *fakepeer.Session, ch uint16) error
	call        func(ctx context.Context, conn *amqp.Connection, ch *amqp.Channel) error
	// check runs once the channel is replaced.
	check func(t *testing.T)
}

func expectAndSend(class, method uint16, reply func(ch uint16) []byte) func(s *fakepeer.Session, ch uint16) error {
	return func(s *fakepeer.Session, ch uint16) error {
		if _, err := s.ExpectMethod(ch, class, method); err != nil {
			return err
		}
		return s.Send(reply(ch))
	}
}

// rpcCases returns every synchronous method of issue #14 that has a
// reply, fresh for each run (the Cancel case keeps state).
func rpcCases() []rpcCase {
	txSelect := func(ctx context.Context, ch *amqp.Channel) error { return ch.Tx() }
	txSelectOk := expectAndSend(classTx, 10, fakepeer.TxSelectOk)
	var deliveries <-chan amqp.Delivery
	return []rpcCase{
		{name: "Channel.QosWithContext", class: classBasic, method: 10,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.QosWithContext(ctx, 10, 0, false)
			}},
		{name: "Channel.CancelWithContext", class: classBasic, method: 30,
			setup: func(ctx context.Context, ch *amqp.Channel) (err error) {
				deliveries, err = ch.Consume("q", "ctag-1", false, false, false, false, nil)
				return err
			},
			answerSetup: func(s *fakepeer.Session, ch uint16) error { _, err := s.AnswerConsume(ch); return err },
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.CancelWithContext(ctx, "ctag-1", false)
			},
			check: func(t *testing.T) {
				// The consumer goes with its channel.
				timer := time.NewTimer(bound)
				defer timer.Stop()
				for {
					select {
					case _, ok := <-deliveries:
						if !ok {
							return
						}
					case <-timer.C:
						t.Errorf("the deliveries chan of the abandoned channel's consumer is still open %v after the channel was replaced", bound)
						return
					}
				}
			}},
		{name: "Channel.QueueDeclareWithContext", class: classQueue, method: 10,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				_, err := ch.QueueDeclareWithContext(ctx, "q", false, false, false, false, nil)
				return err
			}},
		{name: "Channel.QueueDeclarePassiveWithContext", class: classQueue, method: 10,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassiveWithContext(ctx, "q", false, false, false, false, nil)
				return err
			}},
		{name: "Channel.QueueBindWithContext", class: classQueue, method: 20,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.QueueBindWithContext(ctx, "q", "k", "x", false, nil)
			}},
		{name: "Channel.QueueUnbindWithContext", class: classQueue, method: 50,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.QueueUnbindWithContext(ctx, "q", "k", "x", nil)
			}},
		{name: "Channel.QueuePurgeWithContext", class: classQueue, method: 30,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				_, err := ch.QueuePurgeWithContext(ctx, "q", false)
				return err
			}},
		{name: "Channel.QueueDeleteWithContext", class: classQueue, method: 40,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				_, err := ch.QueueDeleteWithContext(ctx, "q", false, false, false)
				return err
			}},
		{name: "Channel.ConsumeWithRPCContext", class: classBasic, method: 20,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				_, err := ch.ConsumeWithRPCContext(ctx, "q", "ctag-1", false, false, false, false, nil)
				return err
			}},
		{name: "Channel.ExchangeDeclareWithContext", class: classExchange, method: 10,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.ExchangeDeclareWithContext(ctx, "x", "direct", false, false, false, false, nil)
			}},
		{name: "Channel.ExchangeDeclarePassiveWithContext", class: classExchange, method: 10,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.ExchangeDeclarePassiveWithContext(ctx, "x", "direct", false, false, false, false, nil)
			}},
		{name: "Channel.ExchangeDeleteWithContext", class: classExchange, method: 20,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.ExchangeDeleteWithContext(ctx, "x", false, false)
			}},
		{name: "Channel.ExchangeBindWithContext", class: classExchange, method: 30,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.ExchangeBindWithContext(ctx, "dst", "k", "src", false, nil)
			}},
		{name: "Channel.ExchangeUnbindWithContext", class: classExchange, method: 40,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.ExchangeUnbindWithContext(ctx, "dst", "k", "src", false, nil)
			}},
		{name: "Channel.GetWithContext", class: classBasic, method: 70,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				_, _, err := ch.GetWithContext(ctx, "q", false)
				return err
			}},
		{name: "Channel.TxWithContext", class: classTx, method: 10,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.TxWithContext(ctx)
			}},
		{name: "Channel.TxCommitWithContext", class: classTx, method: 20, setup: txSelect, answerSetup: txSelectOk,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.TxCommitWithContext(ctx)
			}},
		{name: "Channel.TxRollbackWithContext", class: classTx, method: 30, setup: txSelect, answerSetup: txSelectOk,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.TxRollbackWithContext(ctx)
			}},
		{name: "Channel.FlowWithContext", class: classChannel, method: mChannelFlow,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.FlowWithContext(ctx, false)
			}},
		{name: "Channel.ConfirmWithContext", class: classConfirm, method: 10,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.ConfirmWithContext(ctx, false)
			}},
		{name: "Channel.RecoverWithContext", class: classBasic, method: 110,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.RecoverWithContext(ctx, true)
			}},
		{name: "Channel.CloseWithContext", scope: channelClose, class: classChannel, method: mChannelClose,
			call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
				return ch.CloseWithContext(ctx)
			}},
		{name: "Connection.ChannelWithContext", scope: channelOpen, class: classChannel, method: mChannelOpen,
			call: func(ctx context.Context, conn *amqp.Connection, _ *amqp.Channel) error {
				ch, err := conn.ChannelWithContext(ctx)
				if ch != nil {
					return fmt.Errorf("ChannelWithContext returned channel %v and error %w", ch, err)
				}
				return err
			}},
		{name: "Connection.UpdateSecretWithContext", scope: connLevel, class: classConnection, method: mConnectionUpdateSecret,
			call: func(ctx context.Context, conn *amqp.Connection, _ *amqp.Channel) error {
				return conn.UpdateSecretWithContext(ctx, "new-secret", "rotation")
			}},
		{name: "Connection.CloseWithContext", scope: connClose, class: classConnection, method: mConnectionClose,
			call: func(ctx context.Context, conn *amqp.Connection, _ *amqp.Channel) error {
				return conn.CloseWithContext(ctx)
			}},
	}
}

// TestNeverAnswers: for each synchronous method with a reply, a peer
// that answers everything else but never that one method. The call with
// a 200 ms deadline returns within deadline+grace with an *RPCError that
// matches context.DeadlineExceeded; the peer then receives channel.close
// for that channel (connection.close or the socket's close for the
// connection's methods); after the peer's close-ok a new channel opens
// and completes an RPC, the connection stays up, and no goroutine is
// left.
func TestNeverAnswers(t *testing.T) {
	stats := newOverruns()
	t.Cleanup(func() { t.Logf("never answers, %v deadline:%v", deadline, stats) })
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			verifyNoLeaks(t)
			for i, c := range rpcCases() {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					neverAnswers(t, mode, rpcCases()[i], stats)
				})
			}
		})
	}
}

func neverAnswers(t *testing.T, mode compat.Mode, c rpcCase, stats *overruns) {
	evs := newEvents()
	release := make(chan struct{}) // channelClose: the call has returned
	peer := fakepeer.Listen(t, fakepeer.WithIOTimeout(ioTimeout))
	peer.Serve(evs.script(func(s *fakepeer.Session) error { return neverScript(s, c, evs, release) }))

	conn := dial(t, peer, mode)
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ctx := ctxBound(t)
	var ch *amqp.Channel
	if c.scope == onChannel || c.scope == channelClose {
		var err error
		if ch, err = conn.Channel(); err != nil {
			t.Fatal(err)
		}
		if c.setup != nil {
			if err := c.setup(ctx, ch); err != nil {
				t.Fatalf("setup: %v", err)
			}
		}
	}

	callCtx, cancel := context.WithTimeout(context.Background(), deadline)
	start := time.Now()
	err := c.call(callCtx, conn, ch)
	took := time.Since(start)
	cancel()
	stats.add(mode.String(), took-deadline)
	t.Logf("%v: %s returned after %v (%v past the deadline): %v", mode, c.name, took.Round(100*time.Microsecond),
		(took - deadline).Round(100*time.Microsecond), err)
	if took > deadline+grace {
		t.Errorf("%v: %s took %v against a %v deadline, more than %v past it", mode, c.name, took, deadline, grace)
	}
	req := evs.wait(t, "request")

	switch c.scope {
	case onChannel, channelOpen, channelClose:
		checkAbandoned(t, c.name, err, req.ch, c.scope != channelClose)
		if c.scope == channelClose {
			close(release)
		} else {
			evs.waitClose(t, start.Add(took))
		}
		reopened, err := conn.ChannelWithContext(ctx)
		if err != nil {
			t.Fatalf("%v: a new channel after the abandoned %s: %v", mode, c.name, err)
		}
		evs.wait(t, "reopened")
		if err := reopened.QosWithContext(ctx, 1, 0, false); err != nil {
			t.Fatalf("%v: Qos on the new channel after the abandoned %s: %v", mode, c.name, err)
		}
		if ch != nil && !ch.IsClosed() {
			t.Errorf("%v: the channel of the abandoned %s is not closed", mode, c.name)
		}
		if c.check != nil {
			c.check(t)
		}
		select {
		case e := <-connClosed:
			t.Fatalf("%v: the connection closed after the abandoned %s: %v", mode, c.name, e)
		default:
		}
		if err := conn.Close(); err != nil {
			t.Errorf("%v: Close after the abandoned %s: %v", mode, c.name, err)
		}

	case connLevel:
		checkAbandoned(t, c.name, err, 0, false)
		ev := evs.next(t, "connection.close or the socket closed")
		if ev.what == "conn-close" {
			ev = evs.wait(t, "eof")
		}
		if ev.what != "eof" {
			t.Fatalf("%v: after the abandoned %s the peer reported %q (%v), want connection.close or the socket closed", mode, c.name, ev.what, ev.err)
		}
		waitClosed(t, mode, connClosed, c.name)
		if !conn.IsClosed() {
			t.Errorf("%v: the connection is not closed after its abandoned %s", mode, c.name)
		}
		if err := conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			t.Errorf("%v: Close after the abandoned %s: %v", mode, c.name, err)
		}

	case connClose:
		checkAbandoned(t, c.name, err, 0, false)
		evs.wait(t, "eof")
		waitClosed(t, mode, connClosed, c.name)
		if !conn.IsClosed() {
			t.Errorf("%v: the connection is not closed after its abandoned %s", mode, c.name)
		}
	}
}

// waitClosed waits for the connection's NotifyClose to be closed (with or
// without an error first).
func waitClosed(t *testing.T, mode compat.Mode, connClosed <-chan *amqp.Error, what string) {
	t.Helper()
	select {
	case <-connClosed:
	case <-time.After(bound):
		t.Errorf("%v: NotifyClose got nothing within %v of the abandoned %s", mode, bound, what)
	}
}

// neverScript is the peer of neverAnswers: it answers the setup, leaves
// the case's request unanswered, and then expects what the client must
// close.
func neverScript(s *fakepeer.Session, c rpcCase, evs events, release <-chan struct{}) error {
	var ch uint16
	if c.scope == onChannel || c.scope == channelClose {
		var err error
		if ch, err = s.AnswerChannelOpen(); err != nil {
			return err
		}
		if c.answerSetup != nil {
			if err := c.answerSetup(s, ch); err != nil {
				return err
			}
		}
	}
	f, err := nextMethod(s)
	if err != nil {
		return err
	}
	if !isMethod(f, c.class, c.method) || (ch != 0 && f.Channel != ch) {
		return fmt.Errorf("want the request %d.%d, got %v", c.class, c.method, f)
	}
	ch = f.Channel
	evs.note("request", ch) // and never answer it

	switch c.scope {
	case onChannel, channelOpen:
		if _, err := s.ExpectMethod(ch, classChannel, mChannelClose); err != nil {
			return fmt.Errorf("after the unanswered request: %w", err)
		}
		evs.note("close", ch)
		if err := s.Send(fakepeer.ChannelCloseOk(ch)); err != nil {
			return err
		}
	case channelClose:
		select {
		case <-release:
		case <-s.Done():
			return nil
		}
		if err := s.Send(fakepeer.ChannelCloseOk(ch)); err != nil {
			return err
		}
	case connLevel:
		f, err := nextMethod(s)
		if err == nil && isMethod(f, classConnection, mConnectionClose) && f.Channel == 0 {
			evs.note("conn-close", 0)
			if err := s.Send(fakepeer.ConnectionCloseOk()); err != nil {
				return err
			}
			f, err = nextMethod(s)
		}
		return expectEOF(evs, f, err, "after the unanswered connection.update-secret")
	case connClose:
		f, err := nextMethod(s)
		return expectEOF(evs, f, err, "after the unanswered connection.close")
	}

	// A new channel works.
	reopened, err := s.AnswerChannelOpen()
	if err != nil {
		return fmt.Errorf("the new channel: %w", err)
	}
	evs.note("reopened", reopened)
	if _, err := s.ExpectMethod(reopened, classBasic, 10); err != nil {
		return fmt.Errorf("the new channel's basic.qos: %w", err)
	}
	return s.Send(fakepeer.BasicQosOk(reopened))
}

// expectEOF reports "eof" if err is the end of the connection (not the
// peer's own I/O timeout), and fails if the client sent f instead.
func expectEOF(evs events, f fakepeer.Frame, err error, when string) error {
	switch {
	case err == nil:
		return fmt.Errorf("%s the client sent %v, want the socket closed", when, f)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%s the client kept the socket open for %v: %w", when, ioTimeout, err)
	}
	evs.note("eof", 0)
	return nil
}
