// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Credentials across redials.
//
// Upstream logs in again, at every recovery attempt, with the
// Authentication of the first dial (Config.SASL, or the URL's user and
// password). A password that was rotated, or an OAuth 2 token refreshed
// with UpdateSecret, is not what the next recovery uses, and the recovery
// fails with ACCESS_REFUSED once the old secret has expired.
//
// Config.Credentials, when set, is asked for the Authentication of every
// login: the first dial (Dial, DialConfig, Open, and so every attempt of
// compat.DialCluster) and every recovery attempt. Without it, with safe
// recovery (a read path, or Config.SafeRecovery), the secret of the last
// UpdateSecret replaces the password of the PLAIN and AMQPLAIN
// Authentications that recovery logs in with, as the Java and .NET
// clients keep a refreshed token. In upstream mode without either, logins
// are upstream's.
//
// A login the broker refuses is reported as an error naming the endpoint
// and the user, never the password, that wraps upstream's ErrCredentials:
// every login with Config.Credentials, and recoveries' with safe recovery.

// CredentialsFunc returns the Authentication of a login, as
// Config.Credentials: a PlainAuth with the current password or token, for
// instance. ctx ends at the login's timeout; a func that ignores it is
// waited for no longer, and its late answer is discarded. It may be
// called from several goroutines at once (the recovery of one connection,
// the dial of another).
type CredentialsFunc func(ctx context.Context) (Authentication, error)

// ErrCredentialsProvider is wrapped by the error of a dial or recovery
// attempt whose Config.Credentials returned an error (wrapped too) or no
// Authentication, or did not return within the connection's timeout (the
// URI's connection_timeout for a recovery, 30 s by default). Nothing was
// sent to the broker: the provider is asked before the protocol header.
var ErrCredentialsProvider = errors.New("amqp: credentials provider failed")

// credentialsFor asks provider for the Authentication of a login to
// endpoint, bounded by timeout: a provider that ignores its ctx is left to
// return on its own, and its answer discarded.
func credentialsFor(provider CredentialsFunc, endpoint string, timeout time.Duration) ([]Authentication, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	type answer struct {
		auth Authentication
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		auth, err := provider(ctx)
		done <- answer{auth, err}
	}()
	select {
	case a := <-done:
		switch {
		case a.err != nil:
			return nil, fmt.Errorf("%w for %s: %w", ErrCredentialsProvider, endpoint, a.err)
		case a.auth == nil:
			return nil, fmt.Errorf("%w for %s: it returned no Authentication", ErrCredentialsProvider, endpoint)
		}
		return []Authentication{a.auth}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w for %s: no answer within %v: %w", ErrCredentialsProvider, endpoint, timeout, ctx.Err())
	}
}

// openCredentials is Open's: with Config.Credentials, config.SASL becomes
// the provider's answer for this first login. c.url is not set yet, so the
// bound is the default connection timeout.
func (c *Connection) openCredentials(config *Config) error {
	if config.Credentials == nil {
		return nil
	}
	sasl, err := credentialsFor(config.Credentials, c.endpoint(), defaultConnectionTimeout)
	if err != nil {
		return err
	}
	config.SASL = sasl
	c.Config.SASL = sasl
	return nil
}

// openRecovered is Reconnect's c.open(c.Config): the login of a recovery
// attempt, with the provider's Authentication, or the secret of the last
// UpdateSecret, when they apply.
func (c *Connection) openRecovered() error {
	endpoint := c.endpoint()
	switch {
	case c.Config.Credentials != nil:
		sasl, err := credentialsFor(c.Config.Credentials, endpoint, c.handshakeTimeout())
		if err != nil {
			return err
		}
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

// keepSecret is UpdateSecret's: with safe recovery, newSecret is what later
// recoveries log in with.
func (c *Connection) keepSecret(newSecret string) {
	if c.safeRecovery() {
		c.recovery.secret.Store(&newSecret)
	}
}

// withSecret returns a copy of sasl with secret as the password of its
// PLAIN and AMQPLAIN Authentications; the others are kept as they are.
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

// loginError names the endpoint and the user in a refused login's error,
// which wraps upstream's (ErrCredentials); other errors pass unchanged.
func loginError(err error, endpoint string, sasl []Authentication) error {
	if !errors.Is(err, ErrCredentials) {
		return err
	}
	user := "the configured user"
	if len(sasl) > 0 {
		switch a := sasl[0].(type) {
		case *PlainAuth:
			user = fmt.Sprintf("user %q", a.Username)
		case *AMQPlainAuth:
			user = fmt.Sprintf("user %q", a.Username)
		}
	}
	return fmt.Errorf("amqp: login to %s as %s refused: %w", endpoint, user, err)
}

// endpoint names the broker at the other end of the connection's
// transport, for errors: upstream's RemoteAddr, or "the broker" for a
// transport without an address (RemoteAddr's zero TCPAddr).
func (c *Connection) endpoint() string {
	ra := c.RemoteAddr()
	if a, ok := ra.(*net.TCPAddr); ok && a.Port == 0 && a.IP == nil {
		return "the broker"
	}
	return ra.String()
}
