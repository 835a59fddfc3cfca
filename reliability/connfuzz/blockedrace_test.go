package connfuzz

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// blockedRaceChildEnv, when set to a read mode's name, makes
// TestBlockedNotificationRacesShutdown play the race itself instead of
// running a child process that does.
const blockedRaceChildEnv = "CONNFUZZ_BLOCKED_RACE_CHILD"

// blockedRacePanic is how the Go runtime reports the crash.
const blockedRacePanic = "panic: send on closed channel"

// TestBlockedNotificationRacesShutdown is the reproducer of a crash that
// FuzzConnection found in upstream's own code, which upstream mode and
// legacy mode run: a connection.blocked (or unblocked) being handed to the
// NotifyBlocked listeners while the connection shuts down on another
// goroutine panics the whole process with "send on closed channel".
//
// Connection.dispatch0 copies c.blocks under c.m, then sends to each
// listener with notifyAll, holding no lock, for up to 5 s if the listener
// is not ready. Connection.shutdown, run by Close or, after a failed
// write, by Connection.send on a goroutine of its own, closes those
// listeners in closeResources under c.m and c.notifyM, neither of which
// the sender holds. Nothing makes the two wait for each other, so the
// send can find its channel closed. Upstream guards the channel-level
// notifications this way (notifyM.RLock, noNotify) but not this one. In
// the fuzzer, the failed write is an ack or a heartbeat after the peer
// closed the socket; in production it is a write failing, or Close, while
// the broker raises or clears a memory alarm. Upstream mode keeps the
// bug, and the test expects it to crash. Drainer mode hands notifications
// to mailboxes under notifyM. Legacy mode dispatched channel 0 through the
// same dispatch0 and crashed the same way until legacy.go's notifyBlocks
// took those two methods over, sending under notifyM as upstream does for
// channel notifications; both must survive.
//
// The test makes the race deterministic: of two NotifyBlocked listeners,
// the first is read, which shows that the reader is inside notifyAll, and
// the second never is, which keeps it there; then the peer resets the
// socket and an ack fails, so send starts shutdown. Since the crash
// takes the process down, each mode runs in a child process, and the test
// checks how that child ended.
func TestBlockedNotificationRacesShutdown(t *testing.T) {
	if mode := os.Getenv(blockedRaceChildEnv); mode != "" {
		playBlockedRace(t, mode)
		return
	}
	level.Require(t)
	for _, mode := range fuzzModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*callBound)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBlockedNotificationRacesShutdown$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), blockedRaceChildEnv+"="+mode.String())
			out, err := cmd.CombinedOutput()
			panicked := bytes.Contains(out, []byte(blockedRacePanic))
			t.Logf("child (%v mode) ended with %v, panicked: %v", mode, err, panicked)
			if mode != compat.Upstream {
				if err != nil || panicked {
					t.Fatalf("%v mode must survive the race; the child said:\n%s", mode, out)
				}
				return
			}
			// Under -race the detector may report the send racing the
			// close before the send panics: the same bug, seen first.
			raced := bytes.Contains(out, []byte("WARNING: DATA RACE")) && bytes.Contains(out, []byte("closeResources"))
			if !(panicked || raced) || !bytes.Contains(out, []byte("notifyAll")) || !bytes.Contains(out, []byte("dispatch0")) {
				t.Fatalf("%v mode no longer panics in dispatch0's notifyAll: if it was fixed, "+
					"drop this expectation and FuzzConnection's skip; the child said:\n%s", mode, out)
			}
		})
	}
}

// playBlockedRace is the child's side of TestBlockedNotificationRacesShutdown.
func playBlockedRace(t *testing.T, modeName string) {
	mode, err := compat.ParseMode(modeName)
	if err != nil {
		t.Fatal(err)
	}
	sendBlocked, resetNow, resetDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	peer := listen(t, callBound, func(s *fakepeer.Session) error {
		if _, err := s.AnswerChannelOpen(); err != nil {
			return err
		}
		// Only once Channel has returned: in legacy mode the caller of
		// Channel reads for itself and would dispatch the notification
		// before it returns, instead of DrainEvents.
		select {
		case <-sendBlocked:
		case <-s.Done():
		}
		if err := s.Send(fakepeer.ConnectionBlocked("memory alarm")); err != nil {
			return err
		}
		select {
		case <-resetNow:
		case <-s.Done():
		}
		err := s.Reset()
		close(resetDone)
		return err
	})
	conn, err := compat.DialConfig(peer.URL(), amqp.Config{}, mode)
	if err != nil {
		t.Fatal(err)
	}
	defer startDrainLoop(t, conn)()
	connDone := conn.NotifyClose(make(chan *amqp.Error, 1))
	read := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
	conn.NotifyBlocked(make(chan amqp.Blocking)) // never read
	ch := within(t, callBound, "Channel", func() result[*amqp.Channel] {
		c, err := conn.Channel()
		return result[*amqp.Channel]{c, err}
	}).get(t)
	close(sendBlocked)

	select {
	case <-read:
	case <-time.After(callBound):
		t.Fatal("the connection.blocked never reached the first listener")
	}
	// The reader now waits, for up to 5 s, to hand the notification to
	// the second listener.
	close(resetNow)
	<-resetDone
	// A basic.ack, because Connection.send starts the shutdown when its
	// write fails; a publish's content frames go out another way, which
	// leaves the failure to the reader.
	for i := 0; i < 1000; i++ {
		if err := ch.Ack(1, false); err != nil {
			t.Logf("ack %d failed: %v", i, err)
			break
		}
	}
	// Upstream and legacy mode crash about now. Drainer mode ends the
	// connection with the write's error and lives on.
	select {
	case err := <-connDone:
		t.Logf("connection ended: %v", err)
	case <-time.After(callBound):
		t.Fatal("the connection did not end after the failed write")
	}
	if err := within(t, callBound, "Close", conn.Close); err != nil && !isAMQPError(err) {
		t.Fatalf("Close: %v", err)
	}
}
