package listenerorder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// modes are the read modes every test runs in, one subtest each:
// legacy-autodrain is how a library that never calls DrainEvents runs in
// legacy mode (the process-wide switch's AMQP091_READ_MODE=legacy-autodrain).
var modes = []compat.Mode{compat.Upstream, compat.Drainer, compat.Legacy, compat.LegacyAutoDrain}

const (
	// bound is the hang guard of one step that should take milliseconds.
	bound = 15 * time.Second
	// runBound is the hang guard of one whole subtest's loop.
	runBound = 2 * time.Minute
)

// size picks a test's size: def under a plain go test; small under
// -short and under scripts/reliability short (make test has run the
// package at def sizes already, in its go test ./...); large at
// AMQP091_RELIABILITY=full (make reliability).
func size(t *testing.T, short, def, full int) int {
	t.Helper()
	l, err := level.Get()
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case testing.Short(), l == level.Short:
		return short
	case l == level.Full:
		return full
	default:
		return def
	}
}

var seq atomic.Int64

// uniqueName returns a name no other queue, routing key or connection on
// the broker has.
func uniqueName(t *testing.T, what string) string {
	return fmt.Sprintf("listenerorder-%s-%s-%d-%d",
		strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()), what, time.Now().UnixNano(), seq.Add(1))
}

// dial opens a connection to url in mode; Cleanup closes it.
func dial(t *testing.T, url string, mode compat.Mode) *amqp.Connection {
	t.Helper()
	conn, err := compat.DialConfig(url, amqp.Config{}, mode)
	if err != nil {
		t.Fatalf("dial in %v mode: %v", mode, err)
	}
	if got := conn.ReadMode(); got != mode.String() {
		_ = conn.Close()
		t.Fatalf("ReadMode() = %q, want %q", got, mode)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// verifyNoLeaks registers, first, a Cleanup that runs after every other
// Cleanup of the subtest and checks that no goroutine it started is left.
func verifyNoLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// pump is what a legacy application runs while it waits for
// notifications: nothing reads a legacy connection unless someone calls
// in. It calls DrainEvents from a goroutine until stop is called (or the
// connection ends), and stop waits for that goroutine. In the other modes
// a goroutine of the connection reads anyway, and pump starts nothing.
//
// A legacy publish or RPC waits for a reader blocked in DrainEvents, so a
// test stops its pump before it writes.
func pump(t *testing.T, conn *amqp.Connection, mode compat.Mode) (stop func()) {
	t.Helper()
	if mode != compat.Legacy {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := conn.DrainEvents(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				return // the connection is gone
			}
		}
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(bound):
			t.Errorf("the legacy drain loop did not stop within %v of its cancellation", bound)
		}
	}
	t.Cleanup(stop)
	return stop
}

// examples keeps the first few descriptions of violations for a failure
// message.
type examples struct {
	n    int
	list []string
}

func (e *examples) add(format string, args ...any) {
	e.n++
	if len(e.list) < 5 {
		e.list = append(e.list, fmt.Sprintf(format, args...))
	}
}

func (e *examples) String() string {
	if e.n == 0 {
		return "none"
	}
	return fmt.Sprintf("%d, first: %s", e.n, strings.Join(e.list, "; "))
}

// brokerURL is the real broker's URL.
func brokerURL(t *testing.T) string { return testenv.AMQPURL(t) }
