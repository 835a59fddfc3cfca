// Package testenv finds the RabbitMQ broker this repository's tests run
// against, and owns the end of the test binary.
//
// The broker is discovered once per test binary, on first use, in this
// order:
//
//  1. the AMQP_URL environment variable, which must answer if it is set;
//  2. a broker listening on 127.0.0.1:5672 (amqp://guest:guest@127.0.0.1:5672/);
//  3. a throwaway container of RABBITMQ_IMAGE (default
//     rabbitmq:4.3-management) started with testcontainers-go, if a Docker
//     engine is reachable.
//
// If none is available the calling test fails, saying how to provide one.
// It never skips: a silently skipped integration test is indistinguishable
// from a passing one.
//
// Test packages that use testenv, or package toxi, call Main from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"
)

// Main runs the tests, then everything registered with AtExit (in reverse
// order), then goleak's check for leaked goroutines, and exits.
//
// It is goleak.VerifyTestMain with one difference: goleak.Cleanup runs after
// the leak check, too late to stop a container or a toxiproxy server whose
// client goroutines would otherwise be reported as leaks. So Main wraps
// m.Run instead, and the leak check sees the state after shutdown.
func Main(m *testing.M, opts ...goleak.Option) {
	opts = append(opts,
		// testcontainers keeps one connection to its Ryuk reaper open for
		// the life of the process on purpose: Ryuk removes our containers
		// when it drops, even if this binary is killed.
		goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
	)
	goleak.VerifyTestMain(runner{m}, opts...)
}

// runner is a goleak.TestingM that shuts the environment down after the
// tests and before goleak looks for leaked goroutines.
type runner struct{ m *testing.M }

func (r runner) Run() int {
	exit.mu.Lock()
	exit.active = true
	exit.mu.Unlock()
	defer shutdown()
	return r.m.Run()
}

// exit holds the functions registered with AtExit.
var exit struct {
	mu     sync.Mutex
	active bool // Main is running the tests, so AtExit functions will run
	funcs  []func()
}

// AtExit registers f to run once, after all tests of the binary have
// finished and before the goroutine leak check. Functions run in reverse
// order of registration, like deferred calls. It is for resources shared by
// the whole test binary, such as a broker container or a proxy server.
//
// AtExit returns an error, and does not register f, if TestMain did not call
// Main: f would never run, and the resource would outlive the test binary.
func AtExit(f func()) error {
	exit.mu.Lock()
	defer exit.mu.Unlock()
	if !exit.active {
		return errNoMain
	}
	exit.funcs = append(exit.funcs, f)
	return nil
}

// errNoMain explains what to do when AtExit is refused.
var errNoMain = errors.New("testenv: this test binary starts shared resources that must be " +
	"stopped when it ends, so the package's TestMain must call testenv.Main:\n\n" +
	"\tfunc TestMain(m *testing.M) { testenv.Main(m) }")

func shutdown() {
	exit.mu.Lock()
	funcs := exit.funcs
	exit.funcs, exit.active = nil, false
	exit.mu.Unlock()
	for i := len(funcs) - 1; i >= 0; i-- {
		funcs[i]()
	}
	// Idle keep-alive connections of the default transport (the toxiproxy
	// client and management API calls use it) each hold two goroutines
	// until the idle timeout, which the leak check would report.
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}

// AMQPURL returns the AMQP URL of the test broker, discovering it on first
// use. It fails tb if there is no broker.
func AMQPURL(tb testing.TB) string {
	tb.Helper()
	return found(tb).amqpURL
}

// AMQPAddr returns the host:port of AMQPURL, for code that needs the raw TCP
// endpoint, such as a proxy's upstream.
func AMQPAddr(tb testing.TB) string {
	tb.Helper()
	return found(tb).amqpAddr
}

// ManagementURL returns the base URL of the broker's management HTTP API,
// such as http://127.0.0.1:15672, with no credentials: they are AMQPURL's.
// RABBITMQ_MANAGEMENT_URL overrides it. It fails tb if nothing answers
// there, which usually means the management plugin is not enabled.
func ManagementURL(tb testing.TB) string {
	tb.Helper()
	b := found(tb)
	if err := managementAnswers(); err != nil {
		tb.Fatalf("testenv: the RabbitMQ management API of the %s does not answer at %s: %v\n"+
			"Enable it with: rabbitmq-plugins enable rabbitmq_management\n"+
			"or point RABBITMQ_MANAGEMENT_URL at it.", b.source, b.mgmtURL, err)
	}
	return b.mgmtURL
}

// Dial opens a connection to the test broker with cfg, failing tb if it
// cannot. The connection is closed when the test and its subtests finish.
func Dial(tb testing.TB, cfg amqp.Config) *amqp.Connection {
	tb.Helper()
	u := AMQPURL(tb)
	conn, err := amqp.DialConfig(u, cfg)
	if err != nil {
		tb.Fatalf("testenv: dial %s: %v", redact(u), err)
	}
	// The error is ignored: a test that broke the connection on purpose
	// gets amqp.ErrClosed here, and Close still stops its goroutines.
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// discovered runs the discovery once per test binary and remembers the
// answer, failure included, so every test reports the same reason.
var discovered = sync.OnceValues(func() (broker, error) { return discover(systemProbes) })

func found(tb testing.TB) broker {
	tb.Helper()
	b, err := discovered()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// managementAnswers checks once that the management API accepts TCP
// connections; a refused connection is a far clearer failure than whatever
// HTTP error the test would otherwise see.
var managementAnswers = sync.OnceValue(func() error {
	b, err := discovered()
	if err != nil {
		return err
	}
	u, err := url.Parse(b.mgmtURL)
	if err != nil {
		return err
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443"}[u.Scheme]
		if port == "" {
			port = "80"
		}
	}
	return systemProbes.dial(net.JoinHostPort(u.Hostname(), port), dialTimeout)
})

// redact hides the password of an AMQP URL for messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}

// Channel opens a channel on conn, failing tb if it cannot.
func Channel(tb testing.TB, conn *amqp.Connection) *amqp.Channel {
	tb.Helper()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("testenv: open a channel: %v", err)
	}
	return ch
}

// ExclusiveQueue declares a server-named, exclusive, auto-delete queue on
// ch and returns its name. Tests use exclusive queues because RabbitMQ 4.3
// refuses transient non-exclusive ones.
func ExclusiveQueue(tb testing.TB, ch *amqp.Channel) string {
	tb.Helper()
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		tb.Fatalf("testenv: declare an exclusive queue: %v", err)
	}
	return q.Name
}
