// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Unit tests of the refresh of expiring credentials (refresh.go): the
// timer's arithmetic, and its schedule on synctest's fake clock, against
// upstream's scripted server over a pipe (client_test.go). The broker-facing
// tests, against RabbitMQ's OAuth 2 backend, are reliability/oauth2's.
//
// Every time.Sleep here runs in a synctest bubble: it moves the fake clock to
// the instant the scenario is about (the 8 s of a 10 s token's refresh, the
// next retry), and returns only once every other goroutine of the bubble is
// blocked. It is the schedule under test, never a wait for something to
// happen; synctest.Wait and the scripted server's chan do the synchronising.

func TestRefreshDelay(t *testing.T) {
	for _, tc := range []struct{ lifetime, want time.Duration }{
		{10 * time.Second, 8 * time.Second},              // the fraction
		{time.Hour, 48 * time.Minute},                    // the fraction
		{1100 * time.Millisecond, time.Second},           // the floor: 0.88 s would be sooner
		{500 * time.Millisecond, 500 * time.Millisecond}, // under the floor: at expiry, not after
		{0, 0},
	} {
		if got := refreshDelay(tc.lifetime); got != tc.want {
			t.Errorf("refreshDelay(%v) = %v, want %v", tc.lifetime, got, tc.want)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	const long = time.Hour // a lifetime left that bounds nothing
	for _, tc := range []struct {
		failures  int
		remaining time.Duration
		want      time.Duration
	}{
		{1, long, 500 * time.Millisecond},
		{2, long, time.Second},
		{6, long, 16 * time.Second},
		{7, long, 30 * time.Second}, // the cap
		{40, long, 30 * time.Second},
		{6, 3 * time.Second, 1500 * time.Millisecond},       // half of what remains
		{1, 120 * time.Millisecond, 100 * time.Millisecond}, // the floor
		{3, 0, 100 * time.Millisecond},                      // at the expiry: the floor
		{6, -3 * time.Second, 1500 * time.Millisecond},      // half of the time since the expiry
		{7, -time.Hour, 30 * time.Second},                   // expired long ago: the cap
	} {
		if got := retryDelay(tc.failures, tc.remaining); got != tc.want {
			t.Errorf("retryDelay(%d, %v) = %v, want %v", tc.failures, tc.remaining, got, tc.want)
		}
	}
}

// tokenProvider is a Config.Credentials that hands out numbered secrets of
// one lifetime, or fails while failing is set; it records when it was asked.
type tokenProvider struct {
	mu       sync.Mutex
	lifetime time.Duration
	failing  bool
	asked    []time.Time
}

func (p *tokenProvider) credentials(context.Context) (Authentication, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, time.Now())
	if p.failing {
		return nil, errors.New("token service unavailable")
	}
	secret := fmt.Sprintf("token-%d", len(p.asked))
	return ExpiringAuth{&PlainAuth{Username: "u", Password: secret}, time.Now().Add(p.lifetime)}, nil
}

func (p *tokenProvider) setFailing(f bool) {
	p.mu.Lock()
	p.failing = f
	p.mu.Unlock()
}

func (p *tokenProvider) askedAt(start time.Time) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var at []time.Duration
	for _, a := range p.asked {
		at = append(at, a.Sub(start))
	}
	return at
}

// scripted is upstream's scripted server (client_test.go) whose frames, once
// the handshake is done, a goroutine of its own reads: it drops heartbeats
// and passes methods on. Unread, the client's heartbeater would block on the
// pipe holding the send lock that a refresh waits for, and synctest does not
// count a goroutine waiting for a mutex as durably blocked: the fake clock
// would stop.
type scripted struct {
	*server
	methods chan message
}

// openRefreshing opens a connection with p as its provider on a scripted
// server, with SafeRecovery (upstream mode's opt-in) or without.
func openRefreshing(t *testing.T, p *tokenProvider, safe bool) (*Connection, *scripted) {
	t.Helper()
	rwc, srv := newSession(t)
	done := make(chan struct{})
	go func() { srv.connectionOpen(); close(done) }()
	c, err := Open(rwc, Config{Credentials: p.credentials, SafeRecovery: safe, Vhost: "/"})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	<-done
	s := &scripted{srv, make(chan message, 16)}
	go func() {
		defer close(s.methods)
		for {
			f, err := s.r.ReadFrame()
			if err != nil {
				return // the client closed the pipe
			}
			if mf, ok := f.(*methodFrame); ok {
				s.methods <- mf.Method
			}
		}
	}()
	return c, s
}

// expect returns the next method the client sent, which must be of want's type.
func (s *scripted) expect(want message) message {
	m := <-s.methods
	if fmt.Sprintf("%T", m) != fmt.Sprintf("%T", want) {
		s.Fatalf("the client sent %T, want %T", m, want)
	}
	return m
}

// closeScripted closes c against its scripted server.
func closeScripted(t *testing.T, c *Connection, s *scripted) {
	t.Helper()
	go func() {
		s.expect(&connectionClose{})
		s.send(0, &connectionCloseOk{})
	}()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// expectUpdateSecret has the server read an update-secret and answer it.
func expectUpdateSecret(s *scripted, want string) {
	got := s.expect(&connectionUpdateSecret{}).(*connectionUpdateSecret)
	if got.NewSecret != want {
		s.Errorf("update-secret sent %q, want %q", got.NewSecret, want)
	}
	s.send(0, &connectionUpdateSecretOk{})
}

func TestRefreshAtTheLifetimesFraction(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		p := &tokenProvider{lifetime: 10 * time.Second}
		start := time.Now()
		c, srv := openRefreshing(t, p, true)
		for i := 2; i <= 4; i++ {
			time.Sleep(8 * time.Second) // 80% of the 10 s lifetime
			expectUpdateSecret(srv, fmt.Sprintf("token-%d", i))
			synctest.Wait()
		}
		want := []time.Duration{0, 8 * time.Second, 16 * time.Second, 24 * time.Second}
		if got := p.askedAt(start); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("provider asked at %v, want %v", got, want)
		}
		s := c.Stats().Credentials
		if s.Refreshes != 3 || s.Failures != 0 || !s.Expires.Equal(start.Add(34*time.Second)) {
			t.Errorf("Stats().Credentials = %+v, want 3 refreshes, expiring at +34s", s)
		}
		closeScripted(t, c, srv)
		time.Sleep(time.Minute) // a stopped refresher asks no more
		if got := p.askedAt(start); len(got) != 4 {
			t.Errorf("provider asked %d times, want 4: Close stops the refresh", len(got))
		}
	})
}

func TestRefreshRetriesWithinTheLifetime(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		p := &tokenProvider{lifetime: 10 * time.Second}
		start := time.Now()
		c, srv := openRefreshing(t, p, true)
		p.setFailing(true)
		time.Sleep(9500 * time.Millisecond)
		// 8 s, then 0.5 s later (half of the 2 s left bounds nothing yet), then half of
		// what remains, 0.75 s: the retries close in on the expiry.
		want := []time.Duration{0, 8 * time.Second, 8500 * time.Millisecond, 9250 * time.Millisecond}
		if got := p.askedAt(start); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("provider asked at %v, want %v", got, want)
		}
		p.setFailing(false)
		time.Sleep(375 * time.Millisecond) // the next retry: half of the 0.75 s left
		expectUpdateSecret(srv, "token-5")
		synctest.Wait()
		s := c.Stats().Credentials
		if s.Refreshes != 1 || s.Failures != 3 {
			t.Errorf("Stats().Credentials = %+v, want 1 refresh after 3 failures", s)
		}
		closeScripted(t, c, srv)
	})
}

func TestRefreshRefusesAnExpiredAnswer(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		p := &tokenProvider{lifetime: 10 * time.Second}
		c, srv := openRefreshing(t, p, true)
		p.mu.Lock()
		p.lifetime = -time.Second // the provider's cache hands out a stale token
		p.mu.Unlock()
		time.Sleep(8 * time.Second)
		synctest.Wait()
		s := c.Stats().Credentials
		if s.Refreshes != 0 || s.Failures != 1 {
			t.Errorf("Stats().Credentials = %+v, want 1 failure, nothing sent", s)
		}
		closeScripted(t, c, srv) // the server would fail on an update-secret before the close
	})
}

func TestRefreshNeedsTheOptInUpstream(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		p := &tokenProvider{lifetime: 10 * time.Second}
		c, srv := openRefreshing(t, p, false)
		if c.rp != nil { // upstream's suite run with a read mode forced: it always refreshes
			closeScripted(t, c, srv)
			t.Skip("a read mode is forced: only upstream mode needs the opt-in")
		}
		time.Sleep(time.Minute)
		if n := len(p.askedAt(time.Now())); n != 1 {
			t.Errorf("provider asked %d times without SafeRecovery, want 1 (the login)", n)
		}
		closeScripted(t, c, srv)
	})
}

func TestRefreshErrorsCarryNoSecret(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c := &Connection{Config: Config{SafeRecovery: true}}
		c.Config.Credentials = func(context.Context) (Authentication, error) {
			return ExpiringAuth{&PlainAuth{Password: "s3cret"}, time.Now().Add(-time.Second)}, nil
		}
		_, err := c.installSecret(context.Background())
		if !errors.Is(err, ErrCredentialsExpired) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("installSecret = %v, want ErrCredentialsExpired without the secret", err)
		}
	})
}
