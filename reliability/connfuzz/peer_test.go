package connfuzz

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// AMQP class and method IDs the script expects from the client.
const (
	classBasic     = 60
	classConfirm   = 85
	basicPublish   = 40
	confirmSelect  = 10
	methodAck      = 80
	methodNack     = 120
	methodArgsBase = 4 // class-id and method-id precede a method's arguments
)

// listen starts a fake peer that runs script on the first connection to
// complete the AMQP handshake, and ends with the test.
//
// It is fakepeer's Serve, except that a connection that fails the
// handshake is ignored instead of failing the test: on a shared machine,
// another program's client that keeps retrying a port which our listener
// now holds can connect first (the fuzzer met an HTTP GET), and the real
// client's handshake cannot fail without its dial failing too. Unlike
// Serve, nothing answers the client once script returns, apart from the
// peer closing the socket when the test ends: scripts end the connection
// themselves, or answer Close.
func listen(t *testing.T, ioTimeout time.Duration, script func(*fakepeer.Session) error) *fakepeer.Peer {
	t.Helper()
	var accepting sync.WaitGroup
	// Registered before Listen registers the peer's shutdown, so that it
	// runs after it: the shutdown closes the listener, which ends Accept.
	t.Cleanup(accepting.Wait)
	peer := fakepeer.Listen(t, fakepeer.WithIOTimeout(ioTimeout))
	accepting.Add(1)
	go func() {
		defer accepting.Done()
		for {
			s, err := peer.Accept()
			if errors.Is(err, net.ErrClosed) {
				return // the test is over; its client never connected
			}
			if err != nil {
				t.Logf("ignoring a connection that is not our client's: %v", err)
				continue
			}
			if err := script(s); err != nil {
				t.Errorf("fakepeer script: %v", err)
				_ = s.Close()
			}
			return
		}
	}()
	return peer
}

// serve is the peer's side of one input: it answers the client's setup
// exactly, then sends the stream and ends the connection as the input
// says. It closes sent once the stream is written, or could not be.
//
// Only a failed setup is an error: the setup happens before any fuzzed
// octet, so it can only fail through a bug. Once the stream goes out, the
// client may give up on it at any point and close or reset the socket, so
// the peer's write and read errors are expected and ignored.
func serve(s *fakepeer.Session, in input, sent chan<- struct{}) error {
	if err := setup(s); err != nil {
		close(sent)
		return err
	}
	if in.slice == 0 {
		_ = s.Send(in.stream)
	} else {
		// No pause between slices: the point is that the client's reads
		// end at arbitrary octets, and a pause would only slow the fuzzer
		// down. Each slice is a write of its own on a socket without
		// Nagle, so most reach the client as separate reads.
		_ = s.SendSlices(in.stream, in.slice, 0)
	}
	close(sent)
	switch in.end {
	case endClose:
		_ = s.Close()
	case endReset:
		_ = s.Reset()
	case endGraceful:
		// Fails when the client gave up first and closed the socket:
		// then there is nothing left to answer.
		_ = s.AnswerClose()
		_ = s.Close()
	}
	return nil
}

// setup answers, in order, what run does before the stream: channel.open,
// confirm.select, basic.consume and one basic.publish with its content.
func setup(s *fakepeer.Session) error {
	ch, err := s.AnswerChannelOpen()
	if err != nil {
		return err
	}
	if ch != fuzzChannel {
		return fmt.Errorf("the client opened channel %d; the seeds address channel %d", ch, fuzzChannel)
	}
	if _, err := s.ExpectMethod(ch, classConfirm, confirmSelect); err != nil {
		return err
	}
	if err := s.Send(fakepeer.ConfirmSelectOk(ch)); err != nil {
		return err
	}
	tag, err := s.AnswerConsume(ch)
	if err != nil {
		return err
	}
	if tag != consumerTag {
		return fmt.Errorf("the client consumes as %q; the seeds deliver to %q", tag, consumerTag)
	}
	if _, err := s.ExpectMethod(ch, classBasic, basicPublish); err != nil {
		return err
	}
	for _, want := range []uint8{fakepeer.FrameHeader, fakepeer.FrameBody} {
		f, err := nextFrame(s)
		if err != nil {
			return err
		}
		if f.Type != want || f.Channel != ch {
			return fmt.Errorf("want frame type %d on channel %d of the publish, got %v", want, ch, f)
		}
	}
	return nil
}

// nextFrame reads the next frame that is not a heartbeat.
func nextFrame(s *fakepeer.Session) (fakepeer.Frame, error) {
	for {
		f, err := s.ReadFrame()
		if err != nil || f.Type != fakepeer.FrameHeartbeat {
			return f, err
		}
	}
}
