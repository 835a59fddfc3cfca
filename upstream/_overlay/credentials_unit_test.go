// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Unit tests of the credentials provider and the kept secret
// (credentials.go): no broker. The broker-facing test, with a user the
// test creates and a password changed while connected, is
// reliability/brokerfaults' TestCredentialsAcrossRecovery.

func TestCredentialsForAnswers(t *testing.T) {
	want := &PlainAuth{Username: "u", Password: "p"}
	got, _, err := credentialsFor(context.Background(), func(context.Context) (Authentication, error) { return want, nil }, "host:5672", time.Second)
	if err != nil || len(got) != 1 || got[0] != want {
		t.Fatalf("credentialsFor = %v, %v; want [%v]", got, err, want)
	}
}

func TestCredentialsForFailures(t *testing.T) {
	boom := errors.New("token service unavailable")
	release := make(chan struct{}) // lets the provider that ignores its ctx return at the end
	t.Cleanup(func() { close(release) })
	for _, tc := range []struct {
		name     string
		provider CredentialsFunc
		wraps    error
	}{
		{"error", func(context.Context) (Authentication, error) { return nil, boom }, boom},
		{"no Authentication", func(context.Context) (Authentication, error) { return nil, nil }, nil},
		{"ignores its ctx", func(context.Context) (Authentication, error) {
			<-release // hangs past the bound: the call must not wait for it
			return &PlainAuth{}, nil
		}, context.DeadlineExceeded},
		{"honours its ctx", func(ctx context.Context) (Authentication, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, _, err := credentialsFor(context.Background(), tc.provider, "host:5672", 20*time.Millisecond)
			if !errors.Is(err, ErrCredentialsProvider) || (tc.wraps != nil && !errors.Is(err, tc.wraps)) {
				t.Fatalf("err = %v, want ErrCredentialsProvider wrapping %v", err, tc.wraps)
			}
			if !strings.Contains(err.Error(), "host:5672") {
				t.Errorf("err = %q does not name the endpoint", err)
			}
			if took := time.Since(start); took > 500*time.Millisecond {
				t.Errorf("took %v with a 20ms bound", took)
			}
		})
	}
}

func TestWithSecretReplacesPasswordsOnly(t *testing.T) {
	ext := &ExternalAuth{}
	in := []Authentication{&PlainAuth{Username: "u", Password: "old"}, &AMQPlainAuth{Username: "v", Password: "old"}, ext}
	out := withSecret(in, "new")
	if p := out[0].(*PlainAuth); p.Username != "u" || p.Password != "new" {
		t.Errorf("PLAIN: %+v", p)
	}
	if p := out[1].(*AMQPlainAuth); p.Username != "v" || p.Password != "new" {
		t.Errorf("AMQPLAIN: %+v", p)
	}
	if out[2] != ext {
		t.Error("EXTERNAL was replaced")
	}
	if in[0].(*PlainAuth).Password != "old" {
		t.Error("withSecret changed its input")
	}
}

func TestLoginErrorNamesEndpointAndUserNotPassword(t *testing.T) {
	sasl := []Authentication{&PlainAuth{Username: "alice", Password: "s3cret-pw"}}
	err := loginError(ErrCredentials, "127.0.0.1:5672", sasl)
	if !errors.Is(err, ErrCredentials) {
		t.Fatalf("%v does not wrap ErrCredentials", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "127.0.0.1:5672") || !strings.Contains(msg, `"alice"`) || strings.Contains(msg, "s3cret-pw") {
		t.Fatalf("login error %q: want the endpoint and the user, never the password", msg)
	}
	other := fmt.Errorf("dial: %w", ErrClosed)
	if got := loginError(other, "x", sasl); got != other {
		t.Fatalf("another error changed: %v", got)
	}
	if loginError(nil, "x", sasl) != nil {
		t.Fatal("nil became an error")
	}
}

func TestKeepSecretOnlyWithSafeRecovery(t *testing.T) {
	c := &Connection{}
	c.keepSecret("token-1")
	if c.recovery.secret.Load() != nil {
		t.Fatal("upstream mode without SafeRecovery kept the secret")
	}
	c.Config.SafeRecovery = true
	c.keepSecret("token-2")
	if s := c.recovery.secret.Load(); s == nil || *s != "token-2" {
		t.Fatalf("kept %v, want token-2", s)
	}
}
