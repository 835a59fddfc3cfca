package connfuzz

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// TestUnexpectedChannelZeroMethodIsTakenAsAReply pins what every mode does
// with a method on channel 0 that is not connection.close or
// connection.(un)blocked, here a basic.deliver: it is handed on as the
// reply to the next connection-level call, so Close returns
// ErrCommandInvalid ("unexpected command received").
//
// In upstream mode that hand-over is a send on an unbuffered channel, so
// upstream's reader stops there until a connection-level call (in
// practice only Close) takes the method: nothing after it is read, not
// even the connection.blocked that the peer sends next, and a peer that
// closes the socket meanwhile is noticed only when a heartbeat write
// fails, about a heartbeat interval later. FuzzConnection found it as an
// input that took 10 s with the default 10 s heartbeat, which is why it
// dials with a 1 s heartbeat. Drainer and legacy mode buffer the method
// and read on.
func TestUnexpectedChannelZeroMethodIsTakenAsAReply(t *testing.T) {
	level.Require(t)
	deliver := fakepeer.BasicDeliver(0, consumerTag, 1, false, "", queueName, nil, 0)
	// Only the method frame: its content would be a second oddity.
	deliver = deliver[:len(deliver)-len(fakepeer.Content(0, nil, 0))]
	for _, mode := range fuzzModes {
		t.Run(mode.String(), func(t *testing.T) {
			peer := listen(t, callBound, func(s *fakepeer.Session) error {
				if _, err := s.AnswerChannelOpen(); err != nil {
					return err
				}
				if err := s.Send(deliver, fakepeer.ConnectionBlocked("after the stray method")); err != nil {
					return err
				}
				// Close takes the stray method for its close-ok and closes
				// the socket without waiting for the real one: the peer's
				// answer may well fail.
				_ = s.AnswerClose()
				return nil
			})
			conn, err := compat.DialConfig(peer.URL(), amqp.Config{}, mode)
			if err != nil {
				t.Fatal(err)
			}
			blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
			defer startDrainLoop(t, conn)()
			// Opening the channel is the signal for the peer to send.
			within(t, callBound, "Channel", func() result[*amqp.Channel] {
				c, err := conn.Channel()
				return result[*amqp.Channel]{c, err}
			}).get(t)

			if mode == compat.Upstream {
				// The reader is parked with the stray method: the
				// notification behind it stays unread. A negative can
				// only be checked for a while; half a second is plenty
				// for a frame already in the socket buffer.
				select {
				case b := <-blocks:
					t.Fatalf("upstream read past the stray method (got %+v): "+
						"if upstream buffers it now, update this test and FuzzConnection's heartbeat", b)
				case <-time.After(500 * time.Millisecond):
				}
			} else {
				select {
				case <-blocks:
				case <-time.After(callBound):
					t.Fatalf("the connection.blocked behind the stray method never arrived")
				}
			}

			err = within(t, callBound, "Close", conn.Close)
			t.Logf("Close: %v", err)
			if !errors.Is(err, amqp.ErrCommandInvalid) {
				t.Fatalf("Close returned %v, want ErrCommandInvalid: the stray method taken as close-ok's stand-in", err)
			}
		})
	}
}

// TestLegacyStrayChannelZeroMethods is the reproducer of a hang in legacy
// mode that FuzzConnection found, and checks every mode on the same input:
// more stray methods on channel 0 than the connection buffers as replies
// (strayReplyCap, amqp091's connRPCCap), nine basic.ack on channel 0 here.
//
// Legacy mode used to dispatch them through upstream's
// Connection.dispatch0, which hands each to c.rpc and waits, without a
// bound, until a caller takes it. The ninth send blocked the goroutine
// that was dispatching, which held the read turn: DrainEvents no longer
// returned, whatever its ctx, nothing read or sent heartbeats, and if
// Close was the one pumping, it blocked on the send while it was the
// caller that would take the reply. Legacy mode now fails the connection
// with UnexpectedFrame when the buffer is full, as drainer mode always
// did; upstream's reader waits for Close to take a reply, then shuts
// down. run checks that every call returns in time in every mode.
// strayReplyCap is the number of channel-0 replies drainer and legacy
// mode buffer for a caller: amqp091's connRPCCap.
const strayReplyCap = 8

func TestLegacyStrayChannelZeroMethods(t *testing.T) {
	level.Require(t)
	stray := fakepeer.MethodFrame(0, classBasic, methodAck, new(fakepeer.Args).LongLong(1).Bits(false).Bytes())
	stream := bytes.Repeat(stray, strayReplyCap+1)
	for _, mode := range fuzzModes {
		for _, end := range []ending{endClose, endGraceful} {
			t.Run(fmt.Sprintf("%v/%v", mode, end), func(t *testing.T) {
				run(t, input{mode: mode, end: end, stream: stream})
			})
		}
	}
}
