package oauth2

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/oauthnode"
)

// opBound bounds one broker operation: far above the milliseconds it
// takes, so that only a broker that does not answer hits it.
const opBound = 10 * time.Second

// A timeline logs observations with their time relative to zero: the
// expiry of the connection's first token, or the moment of an update.
type timeline struct {
	t    *testing.T
	zero time.Time
}

// at is when, relative to zero, in seconds.
func (tl *timeline) at(when time.Time) string {
	return fmt.Sprintf("%+7.2fs", when.Sub(tl.zero).Seconds())
}

// logf logs a line stamped with the time relative to zero.
func (tl *timeline) logf(format string, args ...any) {
	tl.t.Helper()
	tl.t.Logf("%s  %s", tl.at(time.Now()), fmt.Sprintf(format, args...))
}

// waitUntil waits until when, or until ctx ends: the tests' points in
// time are the broker's clock, which only passing time moves.
func waitUntil(ctx context.Context, when time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, when)
	defer cancel()
	<-wctx.Done()
	return ctx.Err()
}

// dial connects to n with token as the password; Cleanup closes it.
func dial(t *testing.T, n *oauthnode.Node, token string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(n.URL(), amqp.Config{
		SASL: []amqp.Authentication{&amqp.PlainAuth{Username: "ignored", Password: token}},
		Dial: n.Dial,
	})
	if err != nil {
		t.Fatalf("dial with a token: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// mint is n.Token that fails t on an error.
func mint(t *testing.T, n *oauthnode.Node, ttl time.Duration, scopes ...string) (string, time.Time) {
	t.Helper()
	tok, exp, err := n.Token(ttl, scopes...)
	if err != nil {
		t.Fatal(err)
	}
	return tok, exp
}

// connClose records the connection's close: when, and the broker's error.
type connClose struct {
	done chan struct{} // closed once the connection has closed
	mu   sync.Mutex
	at   time.Time
	err  *amqp.Error
}

// watchClose starts recording conn's close. Its goroutine ends when the
// connection closes, at the latest in the test's Cleanup.
func watchClose(conn *amqp.Connection) *connClose {
	c := &connClose{done: make(chan struct{})}
	ch := conn.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		e, ok := <-ch
		c.mu.Lock()
		c.at = time.Now()
		if ok {
			c.err = e
		}
		c.mu.Unlock()
		close(c.done)
	}()
	return c
}

// wait waits up to d for the connection to close, and reports whether
// it has.
func (c *connClose) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.done:
		return true
	case <-t.C:
		return false
	}
}

// describe says whether and how the connection closed, relative to tl.
func (c *connClose) describe(tl *timeline) string {
	select {
	case <-c.done:
	default:
		return "still open"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		return "closed by the client at " + tl.at(c.at)
	}
	return fmt.Sprintf("closed by the broker at %s: %v", tl.at(c.at), c.err)
}

// A pch is a channel in confirm mode whose close is kept.
type pch struct {
	ch     *amqp.Channel
	closes chan *amqp.Error
	mu     sync.Mutex
	closed error
}

// open opens a channel on conn in confirm mode.
func open(conn *amqp.Connection) (*pch, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("channel.open: %w", err)
	}
	p := &pch{ch: ch, closes: ch.NotifyClose(make(chan *amqp.Error, 1))}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm.select: %w", err)
	}
	return p, nil
}

// closeErr is the error that closed the channel, nil while it is open.
func (p *pch) closeErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed == nil {
		select {
		case e, ok := <-p.closes:
			p.closed = amqp.ErrClosed
			if ok && e != nil {
				p.closed = e
			}
		default:
		}
	}
	return p.closed
}

// publish publishes to exchange and waits for the confirm. A refused
// publish closes the channel; the channel's close error is returned then,
// since the shutdown also nacks the publish.
func (p *pch) publish(ctx context.Context, exchange string) error {
	if err := p.closeErr(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, opBound)
	defer cancel()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "", false, false,
		amqp.Publishing{Body: []byte("probe")})
	if err != nil {
		return err
	}
	select {
	case <-dc.Done():
	case <-ctx.Done():
		return fmt.Errorf("no confirm: %w", ctx.Err())
	}
	if dc.Acked() {
		return nil
	}
	if err := p.closeErr(); err != nil {
		return err
	}
	return errors.New("nacked")
}

// get is basic.get on queue; an empty queue is a success.
func (p *pch) get(queue string) error {
	if err := p.closeErr(); err != nil {
		return err
	}
	_, _, err := p.ch.Get(queue, true)
	return err
}

// fresh runs f on a channel opened for it, and closes the channel.
func fresh(conn *amqp.Connection, f func(*pch) error) error {
	p, err := open(conn)
	if err != nil {
		return err
	}
	defer p.ch.Close()
	return f(p)
}

// declareQueue declares a new exclusive queue (deleted with the
// connection): a resource no channel has touched, so the broker asks the
// backend for configure on it.
func declareQueue(conn *amqp.Connection, name string) error {
	return fresh(conn, func(p *pch) error {
		_, err := p.ch.QueueDeclare(name, false, false, true, false, nil)
		return err
	})
}

// topology declares a fanout exchange and binds each of queues to it,
// declaring them (non-exclusive, so that another connection may use them).
func topology(conn *amqp.Connection, exchange string, queues ...string) error {
	return fresh(conn, func(p *pch) error {
		if err := p.ch.ExchangeDeclare(exchange, "fanout", false, false, false, false, nil); err != nil {
			return err
		}
		for _, q := range queues {
			if _, err := p.ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
				return err
			}
			if err := p.ch.QueueBind(q, "", exchange, false, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// seq makes names unique within the binary.
var seq atomic.Int64

// name returns a resource name unique to this test and what.
func name(t *testing.T, what string) string {
	return fmt.Sprintf("%s-%s-%d", strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()), what, seq.Add(1))
}

// A series is what an operation repeated over the window did.
type series struct {
	name               string
	ok, okAfter, fails int
	lastOK, firstFail  time.Time
	firstErr           error
}

// repeat calls f at once and then every period while the next call
// falls before until, and logs each change between success and failure as
// it happens.
func repeat(ctx context.Context, tl *timeline, what string, period time.Duration, until time.Time,
	f func() error) series {
	s := series{name: what}
	tick := time.NewTicker(period)
	defer tick.Stop()
	failing := false
	for {
		err := f()
		now := time.Now()
		switch {
		case err == nil:
			s.ok++
			s.lastOK = now
			if now.After(tl.zero) {
				s.okAfter++
			}
			if failing {
				tl.logf("%s: succeeds again", what)
			}
		case s.fails == 0:
			s.firstFail, s.firstErr = now, err
			tl.logf("%s: fails: %v", what, err)
		case !failing:
			tl.logf("%s: fails again: %v", what, err)
		}
		if err != nil {
			s.fails++
		}
		failing = err != nil
		if now.Add(period).After(until) {
			return s
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return s
		}
	}
}

// summary is one line on s, times relative to tl.
func (s series) summary(tl *timeline) string {
	line := fmt.Sprintf("%s: %d ok (%d after zero", s.name, s.ok, s.okAfter)
	if s.ok > 0 {
		line += ", last at " + tl.at(s.lastOK)
	}
	line += fmt.Sprintf("), %d failed", s.fails)
	if s.fails > 0 {
		line += fmt.Sprintf(" (first at %s: %v)", tl.at(s.firstFail), s.firstErr)
	}
	return line
}

// concurrently runs each of fs on its own goroutine and returns their
// series in order, once all have returned.
func concurrently(fs ...func() series) []series {
	out := make([]series, len(fs))
	var wg sync.WaitGroup
	for i, f := range fs {
		wg.Go(func() { out[i] = f() })
	}
	wg.Wait()
	return out
}

// consume consumes queue on its own channel of conn, acking each delivery,
// until ctx ends or the channel closes, and returns a series of the
// deliveries (each one an "ok").
func consume(ctx context.Context, tl *timeline, conn *amqp.Connection, queue string) (func() series, error) {
	p, err := open(conn)
	if err != nil {
		return nil, err
	}
	ds, err := p.ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	return func() series {
		s := series{name: "deliveries to a consumer started before zero, each acked"}
		for {
			select {
			case d, ok := <-ds:
				if !ok {
					s.fails, s.firstFail, s.firstErr = 1, time.Now(), p.closeErr()
					tl.logf("%s: the channel closed: %v", s.name, s.firstErr)
					return s
				}
				now := time.Now()
				s.ok++
				s.lastOK = now
				if now.After(tl.zero) {
					s.okAfter++
				}
				if err := d.Ack(false); err != nil {
					tl.logf("ack: %v", err)
				}
			case <-ctx.Done():
				return s
			}
		}
	}, nil
}

// feed publishes to exchange every period until ctx ends, on a connection
// of its own whose token outlives the test, so that a consumer elsewhere
// has deliveries whatever happens to the connection under test.
func feed(ctx context.Context, t *testing.T, n *oauthnode.Node, exchange string, period time.Duration) func() {
	tok, _ := mint(t, n, time.Hour)
	conn := dial(t, n, tok)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				_ = ch.PublishWithContext(ctx, exchange, "", false, false, amqp.Publishing{Body: []byte("feed")})
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() { <-done }
}
