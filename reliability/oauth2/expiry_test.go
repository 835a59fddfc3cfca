package oauth2

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/oauthnode"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// channelTick is RabbitMQ 3.10.8's channel_tick_interval (60000 ms in
// rabbit.app): every channel forgets its cached permission checks that
// often, and whenever it hibernates (after 1 to 10 s without a message).
// The full run watches past it.
const channelTick = 60 * time.Second

// slowPeriod spaces the publishes of a channel meant to hibernate in
// between: more than gen_server2's longest idle time before hibernation.
const slowPeriod = 11 * time.Second

// TestBrokerOnTokenExpiry measures, with the plain upstream API, what the
// broker does when a connection's OAuth 2 token expires, and what
// connection.update-secret does before and after that, with good and bad
// tokens and with narrower scopes. It logs what it sees, each line stamped
// relative to the expiry (or the update), and asserts only what a token
// refresher relies on: a valid update-secret before expiry is accepted and
// keeps the connection usable past the first token's expiry.
func TestBrokerOnTokenExpiry(t *testing.T) {
	n, lvl := node(t)
	ttl := level.Pick(lvl, 5*time.Second, 10*time.Second)
	window := level.Pick(lvl, 3*ttl, channelTick+15*time.Second)
	t.Logf("tokens live %v; each scenario is watched for %v after its zero", ttl, window)
	// Short runs only d: TestRefresh's control, refresh, scopes and past-expiry
	// runs cover a, b, e and c with the refresher, within CI's budget.
	for _, sc := range []struct {
		name  string
		short bool
		f     func(*testing.T)
	}{
		{"a_expiry_without_refresh", false, func(t *testing.T) { expiryWithoutRefresh(t, n, ttl, window) }},
		{"b_refresh_before_expiry", false, func(t *testing.T) { refreshBeforeExpiry(t, n, ttl, window) }},
		{"c_refresh_after_expiry", false, func(t *testing.T) { refreshAfterExpiry(t, n, ttl, window) }},
		{"d_refresh_refused", true, func(t *testing.T) { badRefreshes(t, n) }},
		{"e_scopes_narrowed", false, func(t *testing.T) { narrowedScopes(t, n, window) }},
	} {
		t.Run(sc.name, func(t *testing.T) {
			if lvl != level.Full && !sc.short {
				t.Skip("full only (make reliability): TestRefresh covers it at the short level")
			}
			t.Parallel()
			sc.f(t)
		})
	}
}

// A scene is one scenario's connection, dialled with a token of ttl and
// watched from the token's expiry (its zero) until until.
type scene struct {
	t      *testing.T
	n      *oauthnode.Node
	ctx    context.Context // ends a minute after until: a bound, not a schedule
	tl     *timeline
	ttl    time.Duration
	until  time.Time
	conn   *amqp.Connection
	closed *connClose
}

func newScene(t *testing.T, n *oauthnode.Node, ttl, window time.Duration) *scene {
	tok, exp := mint(t, n, ttl)
	ctx, cancel := context.WithDeadline(context.Background(), exp.Add(window+time.Minute))
	t.Cleanup(cancel)
	conn := dial(t, n, tok)
	return &scene{t: t, n: n, ctx: ctx, tl: &timeline{t: t, zero: exp}, ttl: ttl, until: exp.Add(window),
		conn: conn, closed: watchClose(conn)}
}

// every repeats f every period until the scene ends.
func (s *scene) every(what string, period time.Duration, f func() error) func() series {
	return func() series { return repeat(s.ctx, s.tl, what, period, s.until, f) }
}

// publishing publishes to x on an open channel every 200 ms, often
// enough that the channel never hibernates. It opens the channel and
// publishes once at once, which fills the channel's permission cache.
func (s *scene) publishing(x string) func() series {
	p := mustOpen(s.t, s.conn)
	must(s.t, p.publish(s.ctx, x))
	s.tl.logf("opened the channel that publishes every 200 ms (its tick is 60 s after this)")
	return s.every("publish on an open channel to the exchange it publishes to, every 200 ms",
		200*time.Millisecond, func() error { return p.publish(s.ctx, x) })
}

// getting gets from q on an open channel every 250 ms.
func (s *scene) getting(q string) func() series {
	p := mustOpen(s.t, s.conn)
	return s.every("basic.get on an open channel from the queue it gets from, every 250 ms",
		250*time.Millisecond, func() error { return p.get(q) })
}

// newResources repeats, every 2 s on new channels, the two operations
// that touch something the channel has not checked yet: queue.declare of
// a new queue, and a publish to exchange x. It logs the first's summary
// and returns the second's series.
func (s *scene) newResources(x string) func() series {
	return func() series {
		got := concurrently(
			s.every("queue.declare of a new queue on a new channel, every 2 s", 2*time.Second,
				func() error { return declareQueue(s.conn, name(s.t, "q-new")) }),
			s.every("publish on a new channel to the used exchange, every 2 s", 2*time.Second,
				func() error { return fresh(s.conn, func(p *pch) error { return p.publish(s.ctx, x) }) }),
		)
		s.tl.logf("SUMMARY %s", got[0].summary(s.tl))
		return got[1]
	}
}

// freshChannels opens (and closes) a new channel every 2 s.
func (s *scene) freshChannels() func() series {
	return s.every("channel.open and confirm.select of a new channel, every 2 s", 2*time.Second,
		func() error { return fresh(s.conn, func(*pch) error { return nil }) })
}

// update sends update-secret at zero+at with a fresh full-access token
// that outlives the scene, and returns the outcome as a series of one.
func (s *scene) update(at time.Duration) func() series {
	return func() series {
		out := series{name: "update-secret with a valid token"}
		if err := waitUntil(s.ctx, s.tl.zero.Add(at)); err != nil {
			out.fails, out.firstErr = 1, err
			return out
		}
		tok, exp, err := s.n.Token(time.Until(s.until) + s.ttl)
		if err == nil {
			t0 := time.Now()
			err = s.conn.UpdateSecret(tok, "refresh")
			s.tl.logf("update-secret with a valid token (it expires at %s): %s, after %v",
				s.tl.at(exp), errText(err), time.Since(t0).Round(time.Millisecond))
		}
		if err != nil {
			out.fails, out.firstFail, out.firstErr = 1, time.Now(), err
		} else {
			out.ok, out.lastOK = 1, time.Now()
		}
		return out
	}
}

// report logs each series' summary and the connection's state.
func (s *scene) report(got []series) {
	for _, g := range got {
		s.tl.logf("SUMMARY %s", g.summary(s.tl))
	}
	s.tl.logf("SUMMARY the connection: %s (IsClosed %v)", s.closed.describe(s.tl), s.conn.IsClosed())
}

// expiryWithoutRefresh (a): the token expires on an open connection and is
// never replaced.
func expiryWithoutRefresh(t *testing.T, n *oauthnode.Node, ttl, window time.Duration) {
	s := newScene(t, n, ttl, window)
	x, unused, qc, qg := name(t, "x"), name(t, "x-unused"), name(t, "q-consumed"), name(t, "q-got")
	must(t, topology(s.conn, x, qc, qg), topology(s.conn, unused))
	slow, other := mustOpen(t, s.conn), mustOpen(t, s.conn)
	cctx, cancel := context.WithDeadline(s.ctx, s.until)
	defer cancel()
	consumer, err := consume(cctx, s.tl, s.conn, qc)
	must(t, err)
	fed := feed(cctx, t, n, x, 200*time.Millisecond)
	got := concurrently(
		s.publishing(x),
		s.every("publish on an open channel to the exchange it publishes to, every 11 s", slowPeriod,
			func() error { return slow.publish(s.ctx, x) }),
		s.getting(qg),
		func() series {
			_ = waitUntil(s.ctx, s.tl.zero.Add(time.Second))
			return repeat(s.ctx, s.tl, "publish on an open channel to an exchange it never published to (once, +1 s)",
				time.Second, s.tl.zero, func() error { return other.publish(s.ctx, unused) })
		},
		s.newResources(x),
		s.freshChannels(),
		consumer,
	)
	fed()
	s.report(got)
}

// refreshBeforeExpiry (b): update-secret with a valid token at half the
// first token's lifetime; everything must keep working past its expiry.
func refreshBeforeExpiry(t *testing.T, n *oauthnode.Node, ttl, window time.Duration) {
	s := newScene(t, n, ttl, window)
	x, q := name(t, "x"), name(t, "q")
	must(t, topology(s.conn, x, q))
	got := concurrently(s.update(-ttl/2), s.publishing(x), s.getting(q), s.newResources(x))
	s.report(got)
	if got[0].fails > 0 {
		t.Errorf("update-secret with a valid token before expiry refused: %v", got[0].firstErr)
	}
	for _, g := range got[1:] {
		if g.fails > 0 || g.okAfter == 0 {
			t.Errorf("after a refresh before expiry: %s", g.summary(s.tl))
		}
	}
}

// refreshAfterExpiry (c): the token expires, new resources are refused,
// and one lifetime after expiry update-secret brings a valid token.
func refreshAfterExpiry(t *testing.T, n *oauthnode.Node, ttl, window time.Duration) {
	s := newScene(t, n, ttl, window)
	x := name(t, "x")
	must(t, topology(s.conn, x))
	s.report(concurrently(s.update(ttl), s.publishing(x), s.newResources(x), s.freshChannels()))
}

// badRefreshes (d): update-secret with secrets the broker should refuse,
// each on a connection of its own whose token stays valid. Zero is the
// update.
func badRefreshes(t *testing.T, n *oauthnode.Node) {
	expired, _, err := n.Token(-time.Minute)
	must(t, err)
	foreign, _, err := n.ForeignToken(time.Hour)
	must(t, err)
	for _, c := range []struct{ what, secret string }{
		{"a token signed with the node's key that expired a minute ago", expired},
		{"a token signed with another key (same kid)", foreign},
		{"a string that is no JWT", "not-a-jwt"},
	} {
		badRefresh(t, n, c.what, c.secret)
	}
}

// badRefresh sends one secret the broker should refuse, then tries the
// open channel, a new resource and a new channel.
func badRefresh(t *testing.T, n *oauthnode.Node, what, secret string) {
	tok, _ := mint(t, n, time.Hour)
	conn := dial(t, n, tok)
	closed := watchClose(conn)
	x := name(t, "x")
	must(t, topology(conn, x))
	p := mustOpen(t, conn)
	must(t, p.publish(context.Background(), x))
	tl := &timeline{t: t, zero: time.Now()}
	err := conn.UpdateSecret(secret, "refresh")
	tl.logf("update-secret with %s: %s", what, errText(err))
	// At once, while the channel's permission cache still holds x…
	tl.logf("  then a publish on the open channel to the exchange it published to: %s",
		errText(p.publish(context.Background(), x)))
	// …and once a refusal's connection.close has surely arrived.
	closed.wait(time.Second)
	tl.logf("  then queue.declare of a new queue on a new channel: %s", errText(declareQueue(conn, name(t, "q-new"))))
	tl.logf("  the connection: %s", closed.describe(tl))
}

// narrowedScopes (e): update-secret with a token that may write only to
// exchanges named allowed-*, on a connection that has been publishing to
// another exchange. Zero is the update.
func narrowedScopes(t *testing.T, n *oauthnode.Node, window time.Duration) {
	s := newScene(t, n, window+2*time.Minute, window)
	denied, allowed := name(t, "x"), "allowed-"+name(t, "x")
	must(t, topology(s.conn, denied), topology(s.conn, allowed))
	idle := mustOpen(t, s.conn)
	must(t, idle.publish(s.ctx, denied))
	narrow, _ := mint(t, n, window+2*time.Minute, oauthnode.WriteOnly("allowed-*")...)
	s.tl.zero = time.Now() // a few milliseconds before the update
	s.until = s.tl.zero.Add(window)
	fast := s.publishing(denied)
	err := s.conn.UpdateSecret(narrow, "narrow")
	s.tl.logf("update-secret with write on allowed-* only: %s", errText(err))
	must(t, err)
	s.report(concurrently(
		fast,
		func() series {
			_ = waitUntil(s.ctx, s.tl.zero.Add(slowPeriod))
			return repeat(s.ctx, s.tl, "publish on an open channel to the exchange it published to, idle 11 s before",
				slowPeriod, s.until, func() error { return idle.publish(s.ctx, denied) })
		},
		s.every("publish on a new channel to that exchange, every 2 s", 2*time.Second,
			func() error { return fresh(s.conn, func(p *pch) error { return p.publish(s.ctx, denied) }) }),
		s.every("publish on a new channel to an allowed-* exchange, every 2 s", 2*time.Second,
			func() error { return fresh(s.conn, func(p *pch) error { return p.publish(s.ctx, allowed) }) }),
	))
}

// errText describes err for the log: "ok", or the error with, for the
// broker's own, its code and whether it closed the connection or a
// channel.
func errText(err error) string {
	var e *amqp.Error
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &e) && e.Server:
		scope := "channel"
		if !e.Recover {
			scope = "connection"
		}
		return e.Error() + " [" + scope + " error]"
	}
	return err.Error()
}

func must(t *testing.T, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func mustOpen(t *testing.T, conn *amqp.Connection) *pch {
	t.Helper()
	p, err := open(conn)
	must(t, err)
	return p
}
