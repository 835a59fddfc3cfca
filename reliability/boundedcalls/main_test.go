package boundedcalls

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// modes are the read modes every test runs in, one subtest each. Plain
// legacy needs no drain loop here: a legacy RPC reads the socket itself
// until its reply comes, and so reads the close-ok of an abandoned
// channel and any late reply before its own. legacy-autodrain is the
// legacy mode with the connection's own drain loop.
var modes = []compat.Mode{compat.Upstream, compat.Drainer, compat.Legacy, compat.LegacyAutoDrain}

const (
	// deadline is the context deadline of the calls of the "never
	// answers" and "answers late" tests.
	deadline = 200 * time.Millisecond
	// grace is how long past its deadline a bounded call may take to
	// return: generous, for -race on a loaded two-core machine; the
	// tests log the overruns they measure.
	grace = 1500 * time.Millisecond
	// bound is the hang guard of one step that should take milliseconds,
	// such as the peer receiving the client's channel.close.
	bound = 5 * time.Second
	// ioTimeout bounds each read and write of the fake peer, so that a
	// script waiting for a frame the client never sends ends.
	ioTimeout = 10 * time.Second
)

// Class and method IDs the scripts match.
const (
	classConnection = 10
	classChannel    = 20
	classExchange   = 40
	classQueue      = 50
	classBasic      = 60
	classConfirm    = 85
	classTx         = 90

	mConnectionClose        = 50
	mConnectionUpdateSecret = 70
	mChannelOpen            = 10
	mChannelFlow            = 20
	mChannelClose           = 40
	mChannelCloseOk         = 41
)

// size picks a test's size: def under a plain go test, short under
// -short or AMQP091_RELIABILITY=short, full under AMQP091_RELIABILITY=full.
func size(t testing.TB, short, def, full int) int {
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

// dial opens a connection to the peer in mode; Cleanup closes it.
func dial(t testing.TB, peer *fakepeer.Peer, mode compat.Mode, opts ...compat.Option) *amqp.Connection {
	t.Helper()
	conn, err := compat.DialConfig(peer.URL(), amqp.Config{}, mode, opts...)
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
// Cleanup of the test (and after its subtests) and checks that no
// goroutine it started is left.
func verifyNoLeaks(t testing.TB) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// ctxBound returns a context that ends after bound, for the calls of a
// test that must simply not hang.
func ctxBound(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

// event is what a peer script tells the test: the client's request came
// ("request"), the client closed the channel ("close"), the connection
// ("conn-close") or the socket ("eof"), a new channel was opened
// ("reopened"), or the script failed ("error").
type event struct {
	what string
	ch   uint16
	err  error
}

// events is a peer script's line to the test, buffered so that the
// script never waits for the test.
type events chan event

func newEvents() events { return make(events, 64) }

func (e events) note(what string, ch uint16) {
	select {
	case e <- event{what: what, ch: ch}:
	default:
	}
}

// script wraps a peer script so that its failure reaches the test at
// once, besides the peer's own report.
func (e events) script(run func(s *fakepeer.Session) error) func(s *fakepeer.Session) error {
	return func(s *fakepeer.Session) error {
		err := run(s)
		if err != nil {
			select {
			case e <- event{what: "error", err: err}:
			default:
			}
		}
		return err
	}
}

// next returns the script's next event, whatever it is, failing the test
// for a failed script or none within bound.
func (e events) next(t testing.TB, waitingFor string) event {
	t.Helper()
	return e.nextWithin(t, waitingFor, bound)
}

func (e events) nextWithin(t testing.TB, waitingFor string, d time.Duration) event {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case ev := <-e:
		if ev.what == "error" {
			t.Fatalf("waiting for the peer's %s: the peer script failed: %v", waitingFor, ev.err)
		}
		return ev
	case <-timer.C:
		t.Fatalf("the peer did not report %s within %v%s", waitingFor, d, clientGoroutines())
	}
	return event{}
}

// wait returns the script's next event, which must be what.
func (e events) wait(t testing.TB, what string) event {
	t.Helper()
	return e.waitWithin(t, what, bound)
}

func (e events) waitWithin(t testing.TB, what string, d time.Duration) event {
	t.Helper()
	ev := e.nextWithin(t, fmt.Sprintf("%q", what), d)
	if ev.what != what {
		t.Fatalf("waiting for the peer's %q, the peer reported %q (channel %d)", what, ev.what, ev.ch)
	}
	return ev
}

// waitClose waits for the peer's report of the client's channel.close
// after an abandoned call that returned at returned: it must come within
// grace of the return.
func (e events) waitClose(t testing.TB, returned time.Time) event {
	t.Helper()
	timer := time.NewTimer(time.Until(returned.Add(grace)))
	defer timer.Stop()
	select {
	case ev := <-e:
		switch {
		case ev.what == "error":
			t.Fatalf("waiting for the client's channel.close: the peer script failed: %v", ev.err)
		case ev.what != "close":
			t.Fatalf("waiting for the client's channel.close, the peer reported %q (channel %d)", ev.what, ev.ch)
		}
		return ev
	case <-timer.C:
		t.Fatalf("the client's channel.close did not reach the peer within %v of the abandoned call's return%s", grace, clientGoroutines())
	}
	return event{}
}

// clientGoroutines returns, the first time only, the stacks of the
// goroutines that run code of the client library, for a failure that is
// a hang; later calls return "".
func clientGoroutines() (dump string) {
	dumpOnce.Do(func() {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var out []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "rabbitmq/amqp091-go.") {
				out = append(out, g)
			}
		}
		dump = "; the client's goroutines (dumped once per run):\n" + strings.Join(out, "\n\n")
	})
	return dump
}

var dumpOnce sync.Once

// nextMethod reads the next frame that is not a heartbeat.
func nextMethod(s *fakepeer.Session) (fakepeer.Frame, error) {
	for {
		f, err := s.ReadFrame()
		if err != nil || f.Type != fakepeer.FrameHeartbeat {
			return f, err
		}
	}
}

// isMethod reports whether f is the method class.method.
func isMethod(f fakepeer.Frame, class, method uint16) bool {
	c, m := f.Method()
	return f.Type == fakepeer.FrameMethod && c == class && m == method
}

// overruns collects, per mode, how long bounded calls took past their
// deadline.
type overruns struct {
	mu  sync.Mutex
	max map[string]time.Duration
	sum map[string]time.Duration
	n   map[string]int
}

func newOverruns() *overruns {
	return &overruns{max: map[string]time.Duration{}, sum: map[string]time.Duration{}, n: map[string]int{}}
}

func (o *overruns) add(mode string, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[mode]++
	o.sum[mode] += d
	if d > o.max[mode] || o.n[mode] == 1 {
		o.max[mode] = d
	}
}

func (o *overruns) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := make([]string, 0, len(o.n))
	for k := range o.n {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return modeOrder(keys[i]) < modeOrder(keys[j]) })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-16s %3d calls, overrun past the deadline: max %v, mean %v", k, o.n[k],
			o.max[k].Round(100*time.Microsecond), (o.sum[k] / time.Duration(o.n[k])).Round(100*time.Microsecond))
	}
	return b.String()
}

func modeOrder(name string) int {
	return slices.IndexFunc(modes, func(m compat.Mode) bool { return m.String() == name })
}

// checkAbandoned checks the error of a call whose context ended before
// the reply: an *amqp.RPCError naming channel ch that matches
// context.DeadlineExceeded, and amqp.ErrClosed too when closed says the
// channel (or connection) was closed as a consequence.
func checkAbandoned(t testing.TB, what string, err error, ch uint16, closed bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s returned nil against a peer that never answers", what)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s: error %q (%T) does not match context.DeadlineExceeded", what, err, err)
	}
	var re *amqp.RPCError
	if !errors.As(err, &re) {
		t.Errorf("%s: error %q (%T) is not an *amqp.RPCError", what, err, err)
	} else if re.Channel != ch {
		t.Errorf("%s: RPCError.Channel = %d, want %d (error %q)", what, re.Channel, ch, err)
	}
	if closed && !errors.Is(err, amqp.ErrClosed) {
		t.Errorf("%s: error %q does not match amqp.ErrClosed although the client closed the channel", what, err)
	}
}
