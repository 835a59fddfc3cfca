// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Credentials across redials. Upstream logs in at every recovery with the first dial's
// Authentication, which fails once the password rotated or a token refreshed with UpdateSecret
// expired the old one. Config.Credentials is asked at every login; without it, safe recovery
// sends the last UpdateSecret's secret as the password (PLAIN, AMQPLAIN), as the Java and .NET
// clients do. Then a refused login names endpoint and user, not password.
//
// The provider is asked before anything is written to the socket, and bounded: a provider
// that hangs (a token service that does not answer) must not hold a recovery attempt for
// ever, since upstream's backoff and MaxRetryCount only count attempts that return.

// CredentialsFunc returns a login's Authentication, as Config.Credentials: a PlainAuth with the
// current password or token, say. ctx ends at the login's timeout; a func that ignores it is waited
// for no longer, its late answer discarded. It may be called from several goroutines at once.
type CredentialsFunc func(ctx context.Context) (Authentication, error)

// ErrCredentialsProvider is wrapped by the error of a dial or recovery attempt whose
// Config.Credentials returned an error (wrapped too) or no Authentication, or did not return within
// the connection's timeout (the URI's connection_timeout for a recovery, 30 s by default). Nothing
// was sent to the broker: the provider is asked before the protocol header.
var ErrCredentialsProvider = errors.New("amqp: credentials provider failed")

// credentialsFor asks provider for a login to endpoint, bounded by timeout and ctx, and
// returns its Authentication with the expiry of an ExpiringAuth unwrapped (refresh.go): the
// login sends the inner one, whose password openComplete zeroes. The provider runs on its
// own goroutine, so a provider that ignores its ctx is left behind, not waited for; done is
// buffered so that its late answer never blocks it.
func credentialsFor(ctx context.Context, provider CredentialsFunc, endpoint string,
	timeout time.Duration) ([]Authentication, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// answer carries the provider's two results through one chan.
	type answer struct {
		auth Authentication
		err  error
	}
	done := make(chan answer, 1)
	go func() { auth, err := provider(ctx); done <- answer{auth, err} }()
	select {
	case a := <-done:
		var expires time.Time
		switch e := a.auth.(type) {
		case ExpiringAuth:
			a.auth, expires = e.Authentication, e.Expires
		case *ExpiringAuth:
			a.auth, expires = e.Authentication, e.Expires
		}
		switch {
		case a.err != nil:
			return nil, expires, fmt.Errorf("%w for %s: %w", ErrCredentialsProvider, endpoint, a.err)
		case a.auth == nil:
			return nil, expires, fmt.Errorf("%w for %s: it returned no Authentication",
				ErrCredentialsProvider, endpoint)
		}
		return []Authentication{a.auth}, expires, nil
	case <-ctx.Done():
		return nil, time.Time{}, fmt.Errorf("%w for %s: no answer within %v: %w",
			ErrCredentialsProvider, endpoint, timeout, ctx.Err())
	}
}

// openCredentials is Open's hook: config.SASL becomes the provider's answer, bounded by the
// default connection timeout (Open is given a socket, not a URI with a connection_timeout).
// It is stored in c.Config too, the configuration that recovery starts from.
func (c *Connection) openCredentials(config *Config) error {
	if config.Credentials == nil {
		return nil
	}
	sasl, expires, err := credentialsFor(context.Background(), config.Credentials,
		c.endpoint(), defaultConnectionTimeout)
	if err != nil {
		return err
	}
	c.refresh.login(expires)
	config.SASL = sasl
	c.Config.SASL = sasl
	return nil
}

// openRecovered is Reconnect's c.open(c.Config), with the provider's or UpdateSecret's
// credentials: the provider first, bounded by the URI's connection_timeout; else, with safe
// recovery, the kept secret as the password; else upstream's call unchanged. Only the first
// two wrap a refused login with loginError: upstream's error stays upstream's.
func (c *Connection) openRecovered() error {
	endpoint := c.endpoint()
	// Each case sets the SASL that c.open sends; upstream's Reconnect has restored
	// c.Config.SASL from Open's (or from the URL dialled) just before.
	switch {
	case c.Config.Credentials != nil:
		sasl, expires, err := credentialsFor(context.Background(), c.Config.Credentials, endpoint,
			c.handshakeTimeout())
		if err != nil {
			return err
		}
		c.refresh.login(expires)
		c.Config.SASL = sasl
	case c.safeRecovery():
		if s := c.recovery.secret.Load(); s != nil {
			c.Config.SASL = withSecret(c.Config.SASL, *s)
		}
	default:
		return c.open(c.Config)
	}
	return loginError(c.open(c.Config), endpoint, c.Config.SASL)
}

// keepSecret is UpdateSecret's hook, run before its closed check and its round trip: with
// safe recovery, later recoveries log in with newSecret.
func (c *Connection) keepSecret(newSecret string) {
	if c.safeRecovery() {
		c.recovery.secret.Store(&newSecret)
	}
}

// withSecret returns sasl with secret as the password of its PLAIN and AMQPLAIN
// Authentications, the mechanisms that carry one; others (EXTERNAL, a custom mechanism) are
// kept as they are. sasl is copied and its Authentications replaced, never changed in place.
func withSecret(sasl []Authentication, secret string) []Authentication {
	out := make([]Authentication, len(sasl))
	for i, a := range sasl {
		switch a := a.(type) {
		case *PlainAuth:
			out[i] = &PlainAuth{Username: a.Username, Password: secret}
		case *AMQPlainAuth:
			out[i] = &AMQPlainAuth{Username: a.Username, Password: secret}
		default:
			out[i] = a
		}
	}
	return out
}

// loginError names endpoint and user in a refused login's error (ErrCredentials), never the
// password; other errors pass unchanged.
func loginError(err error, endpoint string, sasl []Authentication) error {
	if !errors.Is(err, ErrCredentials) {
		return err
	}
	user := "the configured user"
	if len(sasl) > 0 {
		if name, _, ok := userAndSecret(sasl[0]); ok {
			user = fmt.Sprintf("user %q", name)
		}
	}
	return fmt.Errorf("amqp: login to %s as %s refused: %w", endpoint, user, err)
}

// userAndSecret returns the user and password of a *PlainAuth or *AMQPlainAuth, the
// mechanisms that carry them: loginError names the user, a refresh sends the password.
func userAndSecret(a Authentication) (user, secret string, ok bool) {
	switch a := a.(type) {
	case *PlainAuth:
		return a.Username, a.Password, true
	case *AMQPlainAuth:
		return a.Username, a.Password, true
	}
	return "", "", false
}

// endpoint names the peer for errors: RemoteAddr, or "the broker" without one (upstream's
// RemoteAddr returns a zero TCPAddr for a transport without a RemoteAddr, a test's, say).
func (c *Connection) endpoint() string {
	ra := c.RemoteAddr()
	if a, ok := ra.(*net.TCPAddr); ok && a.Port == 0 && a.IP == nil {
		return "the broker"
	}
	return ra.String()
}
