package boundedcalls

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// lateCase is a call whose reply the peer sends only after the caller
// has left, and after the client's channel.close.
type lateCase struct {
	name          string
	scope         scope // onChannel, channelOpen or channelClose
	class, method uint16
	call          func(ctx context.Context, conn *amqp.Connection, ch *amqp.Channel) error
	late          func(ch uint16, frameMax uint32) []byte // the late reply; nil: the close-ok is it
}

// lateBody is the body of the late basic.get-ok: larger than the
// negotiated frame-max, so that the client has several content frames to
// discard after the method.
var lateBody = bytes.Repeat([]byte("late "), 60000)

var lateCases = []lateCase{
	{name: "Channel.QueueDeclareWithContext", class: classQueue, method: 10,
		call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
			_, err := ch.QueueDeclareWithContext(ctx, "late", false, false, false, false, nil)
			return err
		},
		late: func(ch uint16, _ uint32) []byte { return fakepeer.QueueDeclareOk(ch, "late", 99, 9) }},
	{name: "Channel.GetWithContext", class: classBasic, method: 70,
		call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
			_, _, err := ch.GetWithContext(ctx, "late", false)
			return err
		},
		late: func(ch uint16, frameMax uint32) []byte {
			return fakepeer.BasicGetOk(ch, 1, false, "", "late", 99, lateBody, frameMax)
		}},
	{name: "Channel.ConsumeWithRPCContext", class: classBasic, method: 20,
		call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
			_, err := ch.ConsumeWithRPCContext(ctx, "late", "ctag-late", false, false, false, false, nil)
			return err
		},
		late: func(ch uint16, frameMax uint32) []byte {
			// The consume-ok, then a delivery to the consumer the client
			// gave up on.
			return append(fakepeer.BasicConsumeOk(ch, "ctag-late"),
				fakepeer.BasicDeliver(ch, "ctag-late", 1, false, "", "late", []byte("late"), frameMax)...)
		}},
	{name: "Connection.ChannelWithContext", scope: channelOpen, class: classChannel, method: mChannelOpen,
		call: func(ctx context.Context, conn *amqp.Connection, _ *amqp.Channel) error {
			ch, err := conn.ChannelWithContext(ctx)
			if ch != nil {
				return fmt.Errorf("ChannelWithContext returned channel %v and error %w", ch, err)
			}
			return err
		},
		late: func(ch uint16, _ uint32) []byte { return fakepeer.ChannelOpenOk(ch) }},
	{name: "Channel.CloseWithContext", scope: channelClose, class: classChannel, method: mChannelClose,
		call: func(ctx context.Context, _ *amqp.Connection, ch *amqp.Channel) error {
			return ch.CloseWithContext(ctx)
		}},
}

// TestLateReplyDiscarded: the peer answers only after the caller's
// deadline and the client's channel.close: the late reply, then
// channel.close-ok (in separate writes, or in one). The client must
// discard the late reply: the connection stays up, a new channel's RPC
// gets its own reply, and so does the RPC of a channel that reuses the
// abandoned channel's id (the peer's channel-max of 2 makes the client's
// allocator wrap onto it).
func TestLateReplyDiscarded(t *testing.T) {
	stats := newOverruns()
	t.Cleanup(func() { t.Logf("answers after the caller left, %v deadline:%v", deadline, stats) })
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			verifyNoLeaks(t)
			for _, c := range lateCases {
				for _, together := range []bool{false, true} {
					name := c.name + "/separate"
					if together {
						name = c.name + "/one-write"
					}
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						lateReply(t, mode, c, together, stats)
					})
				}
			}
		})
	}
}

func lateReply(t *testing.T, mode compat.Mode, c lateCase, together bool, stats *overruns) {
	evs := newEvents()
	release := make(chan struct{})
	peer := fakepeer.Listen(t, fakepeer.WithIOTimeout(ioTimeout), fakepeer.WithChannelMax(2))
	peer.Serve(evs.script(func(s *fakepeer.Session) error { return lateScript(s, c, together, evs, release) }))

	conn := dial(t, peer, mode)
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ctx := ctxBound(t)
	var ch *amqp.Channel
	if c.scope != channelOpen {
		var err error
		if ch, err = conn.Channel(); err != nil {
			t.Fatal(err)
		}
	}
	callCtx, cancel := context.WithTimeout(context.Background(), deadline)
	start := time.Now()
	err := c.call(callCtx, conn, ch)
	took := time.Since(start)
	cancel()
	stats.add(mode.String(), took-deadline)
	if took > deadline+grace {
		t.Errorf("%v: %s took %v against a %v deadline, more than %v past it", mode, c.name, took, deadline, grace)
	}
	req := evs.wait(t, "request")
	checkAbandoned(t, c.name, err, req.ch, c.scope != channelClose)
	if c.scope == channelClose {
		close(release)
	} else {
		evs.waitClose(t, start.Add(took))
	}

	// A new channel, then one on the abandoned channel's id: each RPC
	// gets its own reply.
	for i, want := range []struct {
		name                string
		messages, consumers int
	}{{"fresh-1", 41, 1}, {"fresh-2", 42, 2}} {
		fresh, err := conn.ChannelWithContext(ctx)
		if errors.Is(err, amqp.ErrChannelMax) {
			t.Fatalf("%v: new channel %d after the late reply to %s: %v (the abandoned channel %d's id was not released after its close-ok)",
				mode, i+1, c.name, err, req.ch)
		}
		if err != nil {
			t.Fatalf("%v: new channel %d after the late reply to %s: %v", mode, i+1, c.name, err)
		}
		ev := evs.wait(t, "reopened")
		q, err := fresh.QueueDeclareWithContext(ctx, want.name, false, false, false, false, nil)
		if err != nil {
			t.Fatalf("%v: declare %q on new channel %d after the late reply to %s: %v", mode, want.name, ev.ch, c.name, err)
		}
		if q.Name != want.name || q.Messages != want.messages || q.Consumers != want.consumers {
			t.Errorf("%v: declare %q on new channel %d after the late reply to %s got %+v, want its own reply (%s, %d, %d)",
				mode, want.name, ev.ch, c.name, q, want.name, want.messages, want.consumers)
		}
		if i == 1 {
			t.Logf("%v: %s: abandoned channel %d, then new channels ..., %d (the abandoned id reused: %v)", mode, c.name, req.ch, ev.ch, ev.ch == req.ch)
		}
		if err := fresh.CloseWithContext(ctx); err != nil {
			t.Fatalf("%v: closing new channel %d: %v", mode, ev.ch, err)
		}
	}
	select {
	case e := <-connClosed:
		t.Fatalf("%v: the connection closed after the late reply to %s: %v", mode, c.name, e)
	default:
	}
	if conn.IsClosed() {
		t.Fatalf("%v: the connection is closed after the late reply to %s", mode, c.name)
	}
	if err := conn.Close(); err != nil {
		t.Errorf("%v: Close after the late reply to %s: %v", mode, c.name, err)
	}
}

// lateScript is the peer of lateReply.
func lateScript(s *fakepeer.Session, c lateCase, together bool, evs events, release <-chan struct{}) error {
	var ch uint16
	if c.scope != channelOpen {
		var err error
		if ch, err = s.AnswerChannelOpen(); err != nil {
			return err
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
	evs.note("request", ch)
	if c.scope == channelClose {
		select {
		case <-release:
		case <-s.Done():
			return nil
		}
	} else {
		if _, err := s.ExpectMethod(ch, classChannel, mChannelClose); err != nil {
			return fmt.Errorf("after the unanswered request: %w", err)
		}
		evs.note("close", ch)
	}

	// The caller has left and the client has sent channel.close: now the
	// late reply, then close-ok.
	closeOk := fakepeer.ChannelCloseOk(ch)
	switch {
	case c.late == nil: // the close-ok is the late reply
		err = s.Send(closeOk)
	case together:
		err = s.Send(c.late(ch, s.FrameMax()), closeOk)
	default:
		if err = s.Send(c.late(ch, s.FrameMax())); err == nil {
			s.Pause(20 * time.Millisecond) // the client reads the late reply on its own
			err = s.Send(closeOk)
		}
	}
	if err != nil {
		return err
	}

	for _, want := range []struct {
		name                string
		messages, consumers uint32
	}{{"fresh-1", 41, 1}, {"fresh-2", 42, 2}} {
		fresh, err := s.AnswerChannelOpen()
		if err != nil {
			return fmt.Errorf("the new channel after the late reply: %w", err)
		}
		evs.note("reopened", fresh)
		f, err := s.ExpectMethod(fresh, classQueue, 10)
		if err != nil {
			return fmt.Errorf("the new channel's queue.declare: %w", err)
		}
		a := fakepeer.ReadArgs(f.Args())
		a.Short()
		if name := a.ShortStr(); name != want.name {
			return fmt.Errorf("the new channel %d declared %q, want %q", fresh, name, want.name)
		}
		if err := s.Send(fakepeer.QueueDeclareOk(fresh, want.name, want.messages, want.consumers)); err != nil {
			return err
		}
		if _, err := s.ExpectMethod(fresh, classChannel, mChannelClose); err != nil {
			return fmt.Errorf("the new channel's close: %w", err)
		}
		if err := s.Send(fakepeer.ChannelCloseOk(fresh)); err != nil {
			return err
		}
	}
	return nil
}
