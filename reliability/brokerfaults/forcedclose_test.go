package brokerfaults

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// TestForcedClose: the broker force-closes a connection, the way an
// operator (or a policy) evicts a client: through the management API and,
// where rabbitmqctl is available, with rabbitmqctl close_connection. In
// every mode the application learns it from NotifyClose with the broker's
// own error, every later call fails with an error matching amqp.ErrClosed
// instead of hanging, and Close returns at once.
func TestForcedClose(t *testing.T) {
	lvl := level.Require(t)
	api := newMgmt(t)
	// Full runs force-close more connections per mode: one close is the
	// proof, repeating it shakes out races between the close and the
	// calls that follow it.
	rounds := level.Pick(lvl, 1, 3)
	// Each closer is set up once per subtest: rabbitmqctl's skips the
	// subtest where there is no rabbitmqctl for the test broker.
	closers := []struct {
		via   string
		setUp func(t *testing.T) closeFunc
	}{
		{"management", func(*testing.T) closeFunc {
			return func(t *testing.T, _ *amqp.Connection, clientName string) func(string) error {
				brokerName := api.connectionName(t, clientName)
				return func(reason string) error { return api.closeConnection(brokerName, reason) }
			}
		}},
		{"rabbitmqctl", func(t *testing.T) closeFunc {
			ctl := needCtl(t, api)
			return func(t *testing.T, conn *amqp.Connection, _ string) func(string) error {
				pid := ctl.connectionPid(t, conn)
				return func(reason string) error {
					_, err := ctl.run("close_connection", pid, reason)
					return err
				}
			}
		}},
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			for _, c := range closers {
				t.Run(c.via, func(t *testing.T) {
					forceClose := c.setUp(t)
					for i := 0; i < rounds; i++ {
						forcedClose(t, mode, c.via, forceClose)
					}
				})
			}
		})
	}
}

// A closeFunc finds conn, whose client-provided name is clientName, on
// the broker, and returns the func that has the broker force-close it
// with reason as the text after CONNECTION_FORCED. Finding it takes
// seconds, which the close is not timed with.
type closeFunc func(t *testing.T, conn *amqp.Connection, clientName string) (fire func(reason string) error)

// forcedClose is one force-closed connection, checked from start to end.
func forcedClose(t *testing.T, mode compat.Mode, via string, forceClose closeFunc) {
	verifyNoLeaks(t)
	name := uniqueName(t, "conn")
	conn := dial(t, mode, name)
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	drained := drainLoop(t, conn, mode)

	// A channel that was open and working before the close, so the
	// test covers calls on an existing channel as well as new ones.
	ch := testenv.Channel(t, conn)
	q := testenv.ExclusiveQueue(t, ch)

	fire := forceClose(t, conn, name)
	const reason = "brokerfaults forced close"
	start := time.Now()
	if err := fire(reason); err != nil {
		t.Fatalf("force-close %q through %s: %v", name, via, err)
	}

	var got *amqp.Error
	select {
	case got = <-closes:
	case <-time.After(bound):
		t.Fatalf("NotifyClose did not fire within %v of the forced close", bound)
	}
	notified := time.Since(start)
	if got == nil {
		t.Fatal("NotifyClose was closed without an error: a forced close must be reported as one")
	}
	// What upstream's reader makes of a connection.close from the
	// broker (newError): the broker's code and text, Server because the
	// broker sent it, and Recover false because 320 is a hard error.
	if got.Code != amqp.ConnectionForced || !got.Server || got.Recover ||
		!strings.Contains(got.Reason, "CONNECTION_FORCED") || !strings.Contains(got.Reason, reason) {
		t.Errorf("NotifyClose got %#v, want code %d (CONNECTION_FORCED) with the reason %q, Server true, Recover false",
			got, amqp.ConnectionForced, reason)
	}

	// Afterwards every call fails at once with an error that matches
	// amqp.ErrClosed, which is what applications test for.
	calls := []struct {
		what string
		f    func() error
	}{
		{"an RPC on the open channel", func() error {
			_, err := ch.QueueDeclarePassive(q, false, true, true, false, nil)
			return err
		}},
		{"a publish on the open channel", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			return ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte("after the close")})
		}},
		{"opening a channel", func() error {
			_, err := conn.Channel()
			return err
		}},
	}
	var after time.Duration
	for _, c := range calls {
		took, err := timed(t, bound, c.what+" after the forced close", c.f)
		after = max(after, took)
		if !errors.Is(err, amqp.ErrClosed) {
			t.Errorf("%s after the forced close: err = %v, want one matching amqp.ErrClosed", c.what, err)
		}
	}
	if !conn.IsClosed() {
		t.Error("IsClosed() = false after the forced close")
	}

	closeTook, err := timed(t, bound, "Close after the forced close", conn.Close)
	// Close of a connection that is already gone reports it; what
	// matters is that it returns, and that nothing is left running.
	if err != nil && !errors.Is(err, amqp.ErrClosed) {
		t.Errorf("Close after the forced close: %v, want nil or amqp.ErrClosed", err)
	}
	if mode == compat.Legacy {
		if err := drained(); !errors.Is(err, amqp.ErrClosed) {
			var e *amqp.Error
			if !errors.As(err, &e) || e.Code != amqp.ConnectionForced {
				t.Errorf("the drain loop ended with %v, want the forced close or amqp.ErrClosed", err)
			}
		}
	}
	// Through rabbitmqctl, the time to notification includes the second
	// or so that rabbitmqctl takes to start.
	t.Logf("%v via %s: close notified in %s (%s), calls after it failed with ErrClosed within %s, Close took %s",
		mode, via, ms(notified), got.Reason, ms(after), ms(closeTook))
}
