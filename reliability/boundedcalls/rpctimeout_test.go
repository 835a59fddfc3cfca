package boundedcalls

import (
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// rpcTimeout is the DrainerOptions/LegacyOptions.RPCTimeout of
// TestRPCTimeout.
const rpcTimeout = 200 * time.Millisecond

// TestRPCTimeout: with the read mode's RPCTimeout set, a plain
// QueueDeclare (no context) against a peer that never answers it returns
// after about RPCTimeout with an *RPCError matching amqp.ErrRPCTimeout
// and amqp.ErrClosed; the client closes the channel; the peer's late
// reply, sent after the client's channel.close, is discarded; and a new
// channel's plain QueueDeclare gets its own reply. Upstream mode has no
// RPCTimeout and is not run.
func TestRPCTimeout(t *testing.T) {
	stats := newOverruns()
	t.Cleanup(func() { t.Logf("RPCTimeout %v, plain QueueDeclare:%v", rpcTimeout, stats) })
	for _, mode := range []compat.Mode{compat.Drainer, compat.Legacy, compat.LegacyAutoDrain} {
		t.Run(mode.String(), func(t *testing.T) {
			verifyNoLeaks(t)
			rpcTimeoutQueueDeclare(t, mode, stats)
		})
	}
}

func rpcTimeoutQueueDeclare(t *testing.T, mode compat.Mode, stats *overruns) {
	evs := newEvents()
	peer := fakepeer.Listen(t, fakepeer.WithIOTimeout(ioTimeout))
	peer.Serve(evs.script(func(s *fakepeer.Session) error {
		ch, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		if _, err := s.ExpectMethod(ch, classQueue, 10); err != nil {
			return err
		}
		evs.note("request", ch) // and no reply before the client's close
		if _, err := s.ExpectMethod(ch, classChannel, mChannelClose); err != nil {
			return fmt.Errorf("after the unanswered queue.declare: %w", err)
		}
		evs.note("close", ch)
		if err := s.Send(fakepeer.QueueDeclareOk(ch, "stuck", 99, 9), fakepeer.ChannelCloseOk(ch)); err != nil {
			return err
		}
		fresh, err := s.AnswerChannelOpen()
		if err != nil {
			return fmt.Errorf("the new channel: %w", err)
		}
		evs.note("reopened", fresh)
		if _, err := s.ExpectMethod(fresh, classQueue, 10); err != nil {
			return err
		}
		return s.Send(fakepeer.QueueDeclareOk(fresh, "fresh", 5, 0))
	}))
	conn := dial(t, peer, mode,
		compat.WithDrainerOptions(amqp.DrainerOptions{RPCTimeout: rpcTimeout}),
		compat.WithLegacyOptions(amqp.LegacyOptions{RPCTimeout: rpcTimeout}))
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	_, err = ch.QueueDeclare("stuck", false, false, false, false, nil)
	took := time.Since(start)
	stats.add(mode.String(), took-rpcTimeout)
	t.Logf("%v: QueueDeclare returned after %v: %v", mode, took.Round(100*time.Microsecond), err)
	req := evs.wait(t, "request")
	switch {
	case err == nil:
		t.Fatalf("%v: QueueDeclare returned nil against a peer that never answers", mode)
	case took < rpcTimeout:
		t.Errorf("%v: QueueDeclare gave up after %v, before the RPCTimeout of %v", mode, took, rpcTimeout)
	case took > rpcTimeout+grace:
		t.Errorf("%v: QueueDeclare took %v with an RPCTimeout of %v, more than %v past it", mode, took, rpcTimeout, grace)
	}
	if !errors.Is(err, amqp.ErrRPCTimeout) {
		t.Errorf("%v: error %q (%T) does not match amqp.ErrRPCTimeout", mode, err, err)
	}
	if !errors.Is(err, amqp.ErrClosed) {
		t.Errorf("%v: error %q does not match amqp.ErrClosed although the client closed the channel", mode, err)
	}
	var re *amqp.RPCError
	if !errors.As(err, &re) {
		t.Errorf("%v: error %q (%T) is not an *amqp.RPCError", mode, err, err)
	} else if re.Channel != req.ch || re.Method != "queue.declare" {
		t.Errorf("%v: RPCError{Method: %q, Channel: %d}, want queue.declare on channel %d", mode, re.Method, re.Channel, req.ch)
	}
	evs.waitClose(t, start.Add(took))
	if !ch.IsClosed() {
		t.Errorf("%v: the channel of the timed-out QueueDeclare is not closed", mode)
	}

	fresh, err := conn.Channel()
	if err != nil {
		t.Fatalf("%v: a new channel after the timed-out QueueDeclare: %v", mode, err)
	}
	evs.wait(t, "reopened")
	q, err := fresh.QueueDeclare("fresh", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("%v: QueueDeclare on the new channel: %v", mode, err)
	}
	if q.Name != "fresh" || q.Messages != 5 {
		t.Errorf("%v: QueueDeclare on the new channel got %+v, want its own reply (fresh, 5 messages), not the late one", mode, q)
	}
	select {
	case e := <-connClosed:
		t.Fatalf("%v: the connection closed after the timed-out QueueDeclare: %v", mode, e)
	default:
	}
	if err := conn.Close(); err != nil {
		t.Errorf("%v: Close: %v", mode, err)
	}
}
