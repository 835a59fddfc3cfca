// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Refresh of expiring credentials (#41). An OAuth 2 access token expires by definition, and
// the broker takes a new one on a live connection with connection.update-secret. A provider
// (Config.Credentials) that returns an ExpiringAuth says when its answer stops being valid;
// the connection then asks it again at refreshFraction of the lifetime, on a timer of its
// own, and sends the new secret with UpdateSecret, so that consumers and publishers never
// reconnect for a token.
//
// The protocol, per connection (refresher):
//   - A login records the expiry of the provider's answer (login); the handshake's end
//     (rpOpened) starts a refresh loop for it. Every login does, recoveries included, so a
//     recovered connection refreshes the token it logged in with.
//   - The loop waits on a timer, asks the provider and sends update-secret on a goroutine of
//     its own: never on a reader, whose blocking would stall the frames the reply comes in.
//   - A failure (the provider's error, hang, or expired answer) is retried with a backoff
//     that never waits past half of what remains of the lifetime, so that tries continue
//     up to the expiry, nor, once it passed, more than half of the time since.
//   - Past the expiry the connection is kept, and refreshes go on: RabbitMQ 3.10.8 keeps a
//     connection whose token expired, refuses only the checks its channels have not cached,
//     keeps delivering to consumers, and takes update-secret again (docs/oauth2.md). A
//     refused update-secret is a connection error: the broker closes the connection, and
//     recovery, if configured, logs in afresh with the provider's answer.
//   - The end of a generation (rpShutdown) and Close (rpClosing) cancel the loop's ctx, which
//     ends its wait and the refresh in flight: nothing outlives the connection but a provider
//     that ignores its ctx. One loop runs per generation at most: a generation's end stops
//     it before the next handshake can start another.
//
// Upstream mode refreshes only with SafeRecovery, its opt-in, since its code path is
// upstream's otherwise; the read modes always do.

// ExpiringAuth is an Authentication valid until Expires: what a Config.Credentials provider
// returns for a token, as &PlainAuth{Password: accessToken} with the token's expiry. The
// connection asks the provider again before Expires and installs the new secret with
// UpdateSecret (in upstream mode only with Config.SafeRecovery). The secret is the Password
// of a *PlainAuth or *AMQPlainAuth, the mechanisms that carry one.
type ExpiringAuth struct {
	Authentication
	Expires time.Time
}

// ErrCredentialsExpired is wrapped by a refresh's error when the provider answered with a
// secret already expired, and by the error that ends a connection whose secret expired
// before a new one could be installed.
var ErrCredentialsExpired = errors.New("amqp: credentials expired")

// The refresh timing: the refresh comes at refreshFraction of the lifetime (the Java client's
// default ratio), but not sooner than refreshFloor, so that a provider of second-long tokens
// is not asked in a loop. A failed refresh is retried after retryFirst, doubling up to
// retryMax, and never later than half of what remains of the lifetime, but not sooner than
// retryFloor.
const (
	refreshFraction = 0.8
	refreshFloor    = time.Second
	retryFirst      = 500 * time.Millisecond
	retryMax        = 30 * time.Second
	retryFloor      = 100 * time.Millisecond
)

// refreshDelay is how long after a secret was obtained it is refreshed: refreshFraction of
// its lifetime, at least refreshFloor, and never after it expired.
func refreshDelay(lifetime time.Duration) time.Duration {
	return minOf(maxOf(time.Duration(float64(lifetime)*refreshFraction), refreshFloor), lifetime)
}

// retryDelay is how long after the failures-th failure in a row the refresh is tried again,
// remaining being what is left of the installed secret's lifetime: the backoff, but at most
// half of what remains, so that tries close in on the expiry, and past the expiry at most
// half of the time since it, so that a provider that comes back is asked again within half
// of its outage (3.10.8 takes update-secret after the expiry: docs/oauth2.md). Never sooner
// than retryFloor.
func retryDelay(failures int, remaining time.Duration) time.Duration {
	d := retryMax
	if failures < 7 { // 0.5 s to 16 s; retryFirst<<6 would be past retryMax
		d = retryFirst << (failures - 1)
	}
	if remaining < 0 {
		remaining = -remaining
	}
	return maxOf(minOf(d, remaining/2), retryFloor)
}

// refresher is a connection's refresh state, guarded by mu.
type refresher struct {
	mu                sync.Mutex
	obtained, expires time.Time          // the installed secret's; a zero expires: no refresh
	cancel            context.CancelFunc // ends the last refresh loop started; nil before one

	refreshes, failures uint64 // for Stats
}

// login records the expiry of a login's credentials (zero: they do not expire), before the
// handshake that sends them; rpOpened starts the refresh once it succeeded.
func (r *refresher) login(expires time.Time) {
	r.mu.Lock()
	r.obtained, r.expires = time.Now(), expires
	r.mu.Unlock()
}

// refreshOpened starts the refresh loop of the credentials a handshake sent, if they expire
// and c refreshes them.
func (c *Connection) refreshOpened() {
	r := &c.refresh
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expires.IsZero() || !c.safeRecovery() {
		return
	}
	if r.cancel != nil { // not expected (rpShutdown stops it first), but never two loops
		r.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go c.refreshLoop(ctx, refreshDelay(r.expires.Sub(r.obtained)))
}

// stop ends the refresh loop, and the refresh in flight: the generation ended, or Close
// began. The next login starts another.
func (r *refresher) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil { // a CancelFunc may be called again: no need to forget it
		r.cancel()
	}
}

// refreshLoop waits, asks the provider for a new secret and installs it with update-secret,
// then waits for the next refresh, or for a retry after a failure, until ctx ends. r.mu is
// not held while the provider is asked, so that stop never waits for it; ctx is checked
// under r.mu, where stop cancels it, so that a refresh that ends after stop changes nothing.
// The Logger and the Observer are called after r.mu is let go: they are user code.
func (c *Connection) refreshLoop(ctx context.Context, wait time.Duration) {
	r := &c.refresh
	failed := 0 // in a row, for the backoff
	for {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		start := time.Now()
		expires, err := c.installSecret(ctx)
		r.mu.Lock()
		if ctx.Err() != nil {
			r.mu.Unlock()
			return
		}
		info := RefreshInfo{Expires: expires, Took: time.Since(start), Err: err}
		if err == nil {
			r.refreshes++
			r.obtained, r.expires, failed = start, expires, 0
			wait = refreshDelay(expires.Sub(start))
		} else {
			r.failures++
			failed++
			info.Expires = r.expires
			wait = retryDelay(failed, time.Until(r.expires))
		}
		r.mu.Unlock()
		if err != nil {
			Logger.Printf("Credentials refresh failed: %v", err)
		}
		if obs := c.obsOf(); obs != nil && obs.Refreshed != nil { // the read modes' Observer
			obs.Refreshed(info)
		}
	}
}

// installSecret asks the provider for a secret that has not expired and sends it with
// update-secret; it returns the new secret's expiry.
func (c *Connection) installSecret(ctx context.Context) (time.Time, error) {
	sasl, expires, err := credentialsFor(ctx, c.Config.Credentials, c.endpoint(),
		c.handshakeTimeout())
	if err != nil {
		return time.Time{}, err
	}
	_, secret, ok := userAndSecret(sasl[0])
	switch {
	case !ok:
		return time.Time{}, fmt.Errorf("%w for %s: %s carries no secret to refresh",
			ErrCredentialsProvider, c.endpoint(), sasl[0].Mechanism())
	case !expires.After(time.Now()):
		return time.Time{}, fmt.Errorf("%w: the provider's new secret expired at %s",
			ErrCredentialsExpired, expires.Format(time.RFC3339))
	}
	if err := c.UpdateSecret(secret, "credentials refresh"); err != nil {
		return time.Time{}, fmt.Errorf("amqp: update-secret refused by %s: %w", c.endpoint(), err)
	}
	return expires, nil
}

// stats is Stats' credentials part.
func (r *refresher) stats() CredentialStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return CredentialStats{Refreshes: r.refreshes, Failures: r.failures, Expires: r.expires}
}
