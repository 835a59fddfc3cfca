//go:build !pristine

package micro

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// BenchmarkRPC measures one synchronous round trip, basic.qos to an
// in-process peer that answers at once, four ways, so that what a context
// variant adds (issue #14) reads off one table:
//
//   - call=plain: Channel.Qos, upstream's method;
//   - call=plain+afterfunc: Qos plus one context.AfterFunc registration
//     and its stop, the yardstick the issue sets for a context variant;
//   - call=ctx-background: QosWithContext(context.Background()), which
//     runs Qos on the caller's goroutine;
//   - call=ctx-timeout: QosWithContext with a ctx that can end, which runs
//     Qos on a goroutine of its own and waits for it or for ctx.
//
// Allocations are the whole process's, the peer's parsing and reply
// included; they are the same in every variant, so the differences
// between rows are the client's.
func BenchmarkRPC(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	variants := []struct {
		name string
		call func(ch *amqp.Channel) error
	}{
		{"plain", func(ch *amqp.Channel) error { return ch.Qos(1, 0, false) }},
		{"plain+afterfunc", func(ch *amqp.Channel) error {
			stop := context.AfterFunc(ctx, func() {})
			err := ch.Qos(1, 0, false)
			stop()
			return err
		}},
		{"ctx-background", func(ch *amqp.Channel) error { return ch.QosWithContext(context.Background(), 1, 0, false) }},
		{"ctx-timeout", func(ch *amqp.Channel) error { return ch.QosWithContext(ctx, 1, 0, false) }},
	}
	for _, v := range variants {
		b.Run("call="+v.name, func(b *testing.B) {
			for _, mode := range readmode.Modes() {
				b.Run("mode="+mode, func(b *testing.B) {
					p := fakepeer.Listen(b)
					p.Serve(answerQos)
					conn := dial(b, p, mode, nil)
					// In legacy mode the RPC pumps for its own reply: no
					// drain loop is needed.
					ch, err := conn.Channel()
					if err != nil {
						b.Fatalf("channel: %v", err)
					}
					b.ReportAllocs()
					for b.Loop() {
						if err := v.call(ch); err != nil {
							b.Fatalf("qos: %v", err)
						}
					}
				})
			}
		})
	}
}

// answerQos answers channel.open and every basic.qos at once, and the
// closes at the end.
func answerQos(s *fakepeer.Session) error {
	ch, err := s.AnswerChannelOpen()
	if err != nil {
		return err
	}
	for {
		f, err := s.ReadFrame()
		if err != nil {
			return err
		}
		switch class, method := f.Method(); {
		case f.Type != fakepeer.FrameMethod:
		case class == 60 && method == 10: // basic.qos
			if err := s.Send(fakepeer.BasicQosOk(ch)); err != nil {
				return err
			}
		case class == 20 && method == 40: // channel.close
			if err := s.Send(fakepeer.ChannelCloseOk(f.Channel)); err != nil {
				return err
			}
		case class == 10 && method == 50: // connection.close
			return s.Send(fakepeer.ConnectionCloseOk())
		}
	}
}
