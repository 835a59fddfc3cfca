package oauthnode

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// selfTestName keeps the self-test's node apart from the default one that
// reliability/oauth2 boots, should both packages run at once.
const selfTestName = "oauthself"

// TestNode boots a node and checks what its users rely on: a token logs in
// and is bound by its scopes; an expired token, or one signed with another
// key, is refused at login.
func TestNode(t *testing.T) {
	if ok, why := Usable(); !ok {
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A fixed directory rather than t.TempDir: after a failure the node's
	// logs are still there to read.
	o := Options{Name: selfTestName, Dir: filepath.Join(os.TempDir(), "amqpd-oauth-selftest")}
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	t0 := time.Now()
	n, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	t.Logf("node up in %v at %s, files in %s", time.Since(t0).Round(100*time.Millisecond), n.URL(), n.Dir())

	t.Run("a token logs in", func(t *testing.T) {
		tok, _, err := n.Token(time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ch := channel(t, n, tok)
		if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
			t.Fatalf("queue.declare with full access: %v", err)
		}
		out, err := n.Ctl(ctx, "list_connections", "user")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, Subject) {
			t.Errorf("the connection's user is not the token's sub %q:\n%s", Subject, out)
		}
	})

	t.Run("scopes bind the token", func(t *testing.T) {
		tok, _, err := n.Token(time.Minute, WriteOnly("allowed-*")...)
		if err != nil {
			t.Fatal(err)
		}
		ch := channel(t, n, tok)
		for _, x := range []string{"allowed-x", "denied-x"} {
			if err := ch.ExchangeDeclare(x, "fanout", false, true, false, false, nil); err != nil {
				t.Fatalf("exchange.declare %s (configure on everything): %v", x, err)
			}
		}
		if err := publish(ctx, ch, "allowed-x"); err != nil {
			t.Fatalf("publish to allowed-x: %v", err)
		}
		err = publish(ctx, ch, "denied-x")
		var e *amqp.Error
		if !errors.As(err, &e) || e.Code != amqp.AccessRefused {
			t.Fatalf("publish to denied-x: %v, want a 403 channel close", err)
		}
	})

	refused := func(what string, mint func(time.Duration, ...string) (string, time.Time, error), ttl time.Duration) {
		t.Run(what+" is refused at login", func(t *testing.T) {
			tok, _, err := mint(ttl)
			if err != nil {
				t.Fatal(err)
			}
			conn, err := amqp.DialConfig(n.URL(), config(n, tok))
			if err == nil {
				_ = conn.Close()
				t.Fatal("the broker accepted the token")
			}
			var e *amqp.Error
			if !errors.As(err, &e) || e.Code != amqp.AccessRefused {
				t.Fatalf("login: %v, want 403 ACCESS_REFUSED", err)
			}
		})
	}
	refused("an expired token", n.Token, -time.Minute)
	refused("a token signed with another key", n.ForeignToken, time.Minute)
}

func config(n *Node, token string) amqp.Config {
	return amqp.Config{SASL: []amqp.Authentication{&amqp.PlainAuth{Password: token}}, Dial: n.Dial}
}

// channel dials n with token and opens a channel in confirm mode; both are
// closed when t ends.
func channel(t *testing.T, n *Node, token string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.DialConfig(n.URL(), config(n, token))
	if err != nil {
		t.Fatalf("dial with a token: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch
}

// publish publishes to exchange and waits for the confirm; a refused
// publish closes the channel, which ends the wait with the close's error.
func publish(ctx context.Context, ch *amqp.Channel, exchange string) error {
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "", false, false,
		amqp.Publishing{Body: []byte("x")})
	if err != nil {
		return err
	}
	select {
	case <-dc.Done():
		if dc.Acked() {
			return nil
		}
		// A channel's shutdown nacks what it still waits for, after it has
		// sent its close to the listeners: a nack with a close is the close.
		select {
		case e := <-closed:
			return e
		default:
			return errors.New("nacked")
		}
	case e := <-closed:
		if e == nil {
			return amqp.ErrClosed
		}
		return e
	case <-ctx.Done():
		return ctx.Err()
	}
}
