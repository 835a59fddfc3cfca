package brokerfaults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// modes are the read modes every test runs in, one subtest each.
var modes = []compat.Mode{compat.Upstream, compat.Legacy, compat.Drainer}

const (
	// bound is the generous limit for any step that should be quick
	// (a notification, an RPC, a Close with a broker that answers): the
	// machine is small, shared and noisy, so it is far above the
	// milliseconds these steps take.
	bound = 15 * time.Second
	// heartbeat is what the connections ask for: upstream Dial's default,
	// so the faults meet the heartbeats a typical application has.
	heartbeat = 10 * time.Second
	// drainSlice is the ctx of each DrainEvents call of a legacy drain
	// loop. A legacy reader holds the transport lock for the length of
	// its read, so this is also how long a publish may wait for it.
	drainSlice = 100 * time.Millisecond
	// listBound bounds the wait for the management API to list a new
	// connection, which it does on its statistics interval (5 s by
	// default), not at once.
	listBound = 30 * time.Second
)

// seq makes the names of one test binary's connections and queues unique.
var seq atomic.Int64

// uniqueName returns a name that no other connection or queue on the
// broker has, so a test finds and faults only its own.
func uniqueName(t *testing.T, what string) string {
	return fmt.Sprintf("brokerfaults-%s-%s-%d-%d",
		strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()), what, time.Now().UnixNano(), seq.Add(1))
}

// dial opens a connection in mode whose client-provided name is name, so
// the management API can find it. Cleanup closes it (again), which is a
// no-op for a test that closed it, and stops its goroutines for one that
// failed first.
func dial(t *testing.T, mode compat.Mode, name string) *amqp.Connection {
	t.Helper()
	cfg := amqp.Config{Heartbeat: heartbeat, Properties: amqp.NewConnectionProperties()}
	cfg.Properties.SetClientConnectionName(name)
	conn, err := compat.DialConfig(testenv.AMQPURL(t), cfg, mode)
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

// drainLoop is what a legacy-mode application must run: in legacy mode
// nothing reads the socket unless someone calls in, so notifications
// (close, blocked, cancel) and deliveries arrive only while DrainEvents is
// being called. In the other modes it starts nothing, since a goroutine of
// the connection reads anyway, and the test shows that nothing else is
// needed there.
//
// The loop stops when DrainEvents returns an error other than its ctx
// ending: the connection is gone. The returned func waits (within bound)
// for that and returns the error; Cleanup waits too, so that a test that
// fails early does not leave the loop running past the leak check.
func drainLoop(t *testing.T, conn *amqp.Connection, mode compat.Mode) (wait func() error) {
	t.Helper()
	if mode != compat.Legacy {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), drainSlice)
			err := conn.DrainEvents(ctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				done <- err
				return
			}
		}
	}()
	var (
		result  error
		stopped bool
	)
	wait = func() error {
		if stopped {
			return result
		}
		select {
		case result = <-done:
			stopped = true
			return result
		case <-time.After(bound):
			return fmt.Errorf("the legacy drain loop did not stop within %v of the connection's end", bound)
		}
	}
	t.Cleanup(func() {
		_ = conn.Close() // ends the loop if the test did not get that far
		if err := wait(); !stopped {
			t.Error(err)
		}
	})
	return wait
}

// verifyNoLeaks registers, first, a Cleanup that runs after every other
// Cleanup of the (sub)test and checks that no goroutine started during it
// is still running: each mode must release everything once its
// connections are closed, whatever fault they met.
func verifyNoLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		mgmtTransport.CloseIdleConnections()
		goleak.VerifyNone(t, ignore)
	})
}

// timed runs f in a goroutine and returns how long it took, failing t if
// it takes longer than limit. A call that never returns is abandoned (its
// goroutine then fails the leak check too).
func timed(t *testing.T, limit time.Duration, what string, f func() error) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(limit):
		t.Fatalf("%s did not return within %v", what, limit)
		return 0, nil
	}
}

// ms formats a measured duration for the per-mode log lines.
func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// mgmtTransport is the management API client's own transport, so that the
// leak check can close its idle keep-alive connections, whose goroutines
// it would otherwise report.
var mgmtTransport = &http.Transport{DisableKeepAlives: true}

// mgmt is a client of the broker's management HTTP API.
type mgmt struct {
	base       string
	user, pass string
	client     *http.Client
}

func newMgmt(t *testing.T) *mgmt {
	t.Helper()
	base := testenv.ManagementURL(t)
	uri, err := amqp.ParseURI(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return &mgmt{
		base: strings.TrimSuffix(base, "/"),
		user: uri.Username, pass: uri.Password,
		client: &http.Client{Transport: mgmtTransport, Timeout: 30 * time.Second},
	}
}

// do sends one request and decodes a JSON answer into out, if out is not
// nil. Any status but 2xx is an error.
func (m *mgmt) do(method, path string, header http.Header, out any) error {
	req, err := http.NewRequest(method, m.base+path, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(m.user, m.pass)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, body)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(body, out)
}

// connectionName returns the broker's name (such as "127.0.0.1:50112 ->
// 127.0.0.1:5672") of the connection whose client-provided name is
// clientName. A new connection reaches the management API's listing a
// few seconds after it opens (its statistics interval), so this polls,
// within listBound.
func (m *mgmt) connectionName(t *testing.T, clientName string) string {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(listBound)
	var lastErr error
	for {
		var conns []struct {
			Name             string `json:"name"`
			UserProvidedName string `json:"user_provided_name"`
		}
		lastErr = m.do(http.MethodGet, "/api/connections?columns=name,user_provided_name", nil, &conns)
		for _, c := range conns {
			if c.UserProvidedName == clientName {
				return c.Name
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the management API did not list connection %q within %v (last error: %v)", clientName, listBound, lastErr)
		}
		<-tick.C
	}
}

// closeConnection has the broker force-close a connection, with reason
// as the text after CONNECTION_FORCED.
func (m *mgmt) closeConnection(name, reason string) error {
	return m.do(http.MethodDelete, "/api/connections/"+url.PathEscape(name),
		http.Header{"X-Reason": {reason}}, nil)
}

// node is the broker node's name (such as rabbit@localhost).
func (m *mgmt) node() (string, error) {
	var o struct {
		Node string `json:"node"`
	}
	if err := m.do(http.MethodGet, "/api/overview", nil, &o); err != nil {
		return "", err
	}
	return o.Node, nil
}
