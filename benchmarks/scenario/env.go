package scenario

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// QueuePrefix starts the name of every queue and proxy the suite creates,
// so that the runner can sweep away whatever a killed run left behind.
const QueuePrefix = "bench-"

// An Env is what a scenario runs against.
type Env struct {
	URL       string // the broker's AMQP URL
	Toxiproxy string // Toxiproxy's API URL; empty when none runs
	Mode      string // the read mode under test
	Quick     bool   // smoke-test sizes: seconds, not minutes
	// Messages, when non-zero, overrides the message count of the
	// scenarios that take one (Count), so that a long measurement can be
	// shortened on a loaded machine without a rebuild.
	Messages int
	// Artefacts is where this run saves files beside the results, as a
	// path prefix (the results directory and the run's scenario, case,
	// variant and repetition); empty when the runner asked for none.
	Artefacts string

	mu       sync.Mutex
	cleanups []func()
	n        atomic.Int64
}

// Build names the build the scenario runs in: pristine or patched.
func (e *Env) Build() string { return readmode.Build }

// Dial opens a connection to the broker in the mode under test.
func (e *Env) Dial(cfg amqp.Config) (*amqp.Connection, error) {
	return e.DialURL(e.URL, cfg)
}

// DialURL opens a connection to u, a proxy for instance, in the mode
// under test.
func (e *Env) DialURL(u string, cfg amqp.Config) (*amqp.Connection, error) {
	conn, err := readmode.DialConfig(u, cfg, e.Mode)
	if err != nil {
		return nil, fmt.Errorf("dial %s mode: %w", e.Mode, err)
	}
	return conn, nil
}

// Count returns the message count of a scenario that takes one: the
// runner's -n when given, else quick under -quick, else def.
func (e *Env) Count(def, quick int) int {
	switch {
	case e.Messages > 0:
		return e.Messages
	case e.Quick:
		return quick
	}
	return def
}

// ArtefactPath returns the file this run saves an artefact to, named by
// its suffix (".pprof"), or "" when the runner asked for none.
func (e *Env) ArtefactPath(suffix string) string {
	if e.Artefacts == "" {
		return ""
	}
	return e.Artefacts + suffix
}

// Name returns a unique name for a queue or proxy of this run.
func (e *Env) Name(what string) string {
	return fmt.Sprintf("%s%s-%d-%d", QueuePrefix, what, os.Getpid(), e.n.Add(1))
}

// Defer registers f to run when the scenario ends, last registered first.
func (e *Env) Defer(f func()) {
	e.mu.Lock()
	e.cleanups = append(e.cleanups, f)
	e.mu.Unlock()
}

// Cleanup runs the deferred functions.
func (e *Env) Cleanup() {
	e.mu.Lock()
	fs := e.cleanups
	e.cleanups = nil
	e.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// Queue declares a fresh non-durable queue on a connection of its own in
// upstream's reader (whatever the mode under test, so that bookkeeping
// never measures itself), and deletes it when the scenario ends.
func (e *Env) Queue() (string, error) {
	name := e.Name("q")
	err := e.admin(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, false, false, false, false, nil)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("declare queue %s: %w", name, err)
	}
	e.Defer(func() {
		_ = e.admin(func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(name, false, false, false)
			return err
		})
	})
	return name, nil
}

// QueueDepth returns how many messages queue holds, ready for delivery.
func (e *Env) QueueDepth(queue string) (int, error) {
	var n int
	err := e.admin(func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n, err
}

// admin runs f on a short-lived upstream-mode channel.
func (e *Env) admin(f func(*amqp.Channel) error) error {
	conn, err := amqp.Dial(e.URL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return f(ch)
}

// Proxy creates a Toxiproxy proxy to the broker and returns it with the
// AMQP URL that reaches the broker through it. It is deleted, with every
// connection through it, when the scenario ends.
func (e *Env) Proxy() (*toxiproxy.Proxy, string, error) {
	if e.Toxiproxy == "" {
		return nil, "", errors.New("this scenario needs Toxiproxy: set TOXIPROXY_URL (the runner starts one)")
	}
	u, err := url.Parse(e.URL)
	if err != nil {
		return nil, "", err
	}
	upstream := u.Host
	if to := os.Getenv("TOXIPROXY_UPSTREAM_AMQP"); to != "" {
		upstream = to
	}
	p, err := toxiproxy.NewClient(e.Toxiproxy).CreateProxy(e.Name("proxy"), "127.0.0.1:0", upstream)
	if err != nil {
		return nil, "", fmt.Errorf("create proxy: %w", err)
	}
	e.Defer(func() { _ = p.Delete() })
	u.Host = p.Listen
	return p, u.String(), nil
}

// StartDrainLoop keeps conn's frames flowing in legacy mode, where nothing
// is delivered unless a caller drains: it loops DrainEvents with the given
// timeout until the returned stop is called, which waits for it to end. In
// the other modes a reader goroutine already does this, and it does
// nothing.
func StartDrainLoop(conn *amqp.Connection, mode string, timeout time.Duration) (stop func()) {
	if mode != readmode.Legacy {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			dctx, c := context.WithTimeout(ctx, timeout)
			err := readmode.DrainEvents(dctx, conn)
			timedOut := dctx.Err() != nil // before c() cancels it
			c()
			if err != nil && !timedOut {
				return // the connection is closed or broken
			}
		}
	}()
	return func() { cancel(); <-done }
}
