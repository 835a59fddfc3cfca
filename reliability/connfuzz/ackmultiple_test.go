package connfuzz

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// TestAckMultipleIsLinearInTheTag pins the one behaviour FuzzConnection
// keeps out of its inputs (see maxMultipleTag): one basic.ack with the
// multiple flag and delivery tag n, on a channel in confirm mode where one
// message was published. Upstream and legacy mode (upstream's
// confirms.Multiple) hand NotifyPublish n confirmations, tags 1 to n, one
// by one: the cost is linear in a number the broker picks, and with
// n = 2^40 they spin for weeks. Drainer mode settles only what was
// published, one confirmation; before it did, it collected all n in a
// slice first and a tag of 2^40 crashed the process out of memory.
func TestAckMultipleIsLinearInTheTag(t *testing.T) {
	level.Require(t)
	const n = 10000
	for _, mode := range fuzzModes {
		t.Run(mode.String(), func(t *testing.T) {
			peer := listen(t, callBound, func(s *fakepeer.Session) error {
				ch, err := s.AnswerChannelOpen()
				if err != nil {
					return err
				}
				if _, err := s.ExpectMethod(ch, classConfirm, confirmSelect); err != nil {
					return err
				}
				if err := s.Send(fakepeer.ConfirmSelectOk(ch)); err != nil {
					return err
				}
				// The ack goes out once the client published, as a broker's
				// would: before, the channel may not have switched to
				// confirm mode yet and would drop it.
				if _, err := s.ExpectMethod(ch, classBasic, basicPublish); err != nil {
					return err
				}
				if err := s.Send(fakepeer.BasicAck(ch, n, true)); err != nil {
					return err
				}
				return s.AnswerClose()
			})
			conn, err := compat.DialConfig(peer.URL(), amqp.Config{}, mode)
			if err != nil {
				t.Fatal(err)
			}
			stopDrain := startDrainLoop(t, conn)
			defer func() {
				stopDrain()
				if err := within(t, callBound, "Close", conn.Close); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()

			ch := within(t, callBound, "Channel", func() result[*amqp.Channel] {
				c, err := conn.Channel()
				return result[*amqp.Channel]{c, err}
			}).get(t)
			within(t, callBound, "Confirm", func() result[struct{}] {
				return result[struct{}]{err: ch.Confirm(false)}
			}).get(t)
			// The buffer takes every confirmation, so that none waits
			// for this goroutine.
			confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
			start := time.Now()
			within(t, callBound, "Publish", func() result[struct{}] {
				return result[struct{}]{err: ch.PublishWithContext(context.Background(), "", queueName, false, false, amqp.Publishing{})}
			}).get(t)
			settled := uint64(n)
			if mode == compat.Drainer {
				settled = 1 // only the published tag
			}
			for want := uint64(1); want <= settled; want++ {
				select {
				case c := <-confirms:
					if c.DeliveryTag != want || !c.Ack {
						t.Fatalf("confirmation %d is %+v, want tag %d acked", want, c, want)
					}
				case <-time.After(callBound):
					t.Fatalf("%d confirmations of %d within %s", want-1, settled, callBound)
				}
			}
			elapsed := time.Since(start)
			t.Logf("%v: 1 frame with tag %d and multiple set, 1 published: %d confirmations in %s",
				mode, n, settled, elapsed.Round(time.Millisecond))
		})
	}
}

// TestBoundAckMultiple checks the one rewrite FuzzConnection makes to its
// inputs: the tag of anything any reader could take for a basic.ack or
// basic.nack with multiple set, and nothing else.
func TestBoundAckMultiple(t *testing.T) {
	level.Require(t)
	const ch, huge = fuzzChannel, 1 << 40
	cat := func(frames ...[]byte) []byte { return bytes.Join(frames, nil) }
	ack, bounded := fakepeer.BasicAck(ch, huge, true), fakepeer.BasicAck(ch, maxMultipleTag, true)
	badEnd, badEndBounded := bytes.Clone(ack), bytes.Clone(bounded)
	badEnd[len(badEnd)-1], badEndBounded[len(badEndBounded)-1] = 0, 0
	// A size field that claims more than the stream holds: upstream reads
	// the ack anyway.
	oversize, oversizeBounded := bytes.Clone(ack), bytes.Clone(bounded)
	binary.BigEndian.PutUint32(oversize[3:], 12301)
	binary.BigEndian.PutUint32(oversizeBounded[3:], 12301)
	const tagEnd = 7 + methodArgsBase + 8 // frame header, IDs, tag
	for _, c := range []struct {
		name     string
		in, want []byte
	}{
		{"ack multiple", ack, bounded},
		{"nack multiple", fakepeer.BasicNack(ch, huge, true, true), fakepeer.BasicNack(ch, maxMultipleTag, true, true)},
		{"ack multiple within the bound", fakepeer.BasicAck(ch, 3, true), fakepeer.BasicAck(ch, 3, true)},
		{"ack single", fakepeer.BasicAck(ch, huge, false), fakepeer.BasicAck(ch, huge, false)},
		{"nack single", fakepeer.BasicNack(ch, huge, false, true), fakepeer.BasicNack(ch, huge, false, true)},
		{"after other frames",
			cat(fakepeer.HeartbeatFrame(), fakepeer.BasicDeliver(ch, consumerTag, huge, false, "", "", []byte("x"), 0), ack),
			cat(fakepeer.HeartbeatFrame(), fakepeer.BasicDeliver(ch, consumerTag, huge, false, "", "", []byte("x"), 0), bounded)},
		{"two in a row", cat(ack, ack), cat(bounded, bounded)},
		{"bad frame-end", badEnd, badEndBounded},
		{"size field past the end", oversize, oversizeBounded},
		{"bits octet from close-ok", ack[:tagEnd], bounded[:tagEnd]},
		{"tag cut short", ack[:tagEnd-4], ack[:tagEnd-4]},
		{"bits missing, frame-end read as bits", fakepeer.MethodFrame(ch, classBasic, methodAck, binary.BigEndian.AppendUint64(nil, huge)),
			fakepeer.MethodFrame(ch, classBasic, methodAck, binary.BigEndian.AppendUint64(nil, huge))},
		{"empty", nil, []byte{}},
	} {
		in := bytes.Clone(c.in)
		if got := boundAckMultiple(in); !bytes.Equal(got, c.want) {
			t.Errorf("%s: got\n%x\nwant\n%x", c.name, got, c.want)
		}
		if !bytes.Equal(in, c.in) {
			t.Errorf("%s: the input was modified", c.name)
		}
	}
}
