package compat_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestParseMode(t *testing.T) {
	for in, want := range map[string]compat.Mode{
		"upstream": compat.Upstream, "UPSTREAM": compat.Upstream,
		"legacy": compat.Legacy, " Legacy ": compat.Legacy,
		"drainer": compat.Drainer, "Drainer": compat.Drainer,
		"legacy-autodrain": compat.LegacyAutoDrain, "Legacy-AutoDrain": compat.LegacyAutoDrain,
	} {
		got, err := compat.ParseMode(in)
		if err != nil || got != want {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", in, got, err, want)
		}
		if got.String() != strings.ToLower(strings.TrimSpace(in)) {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
	for _, bad := range []string{"", "drain", "upstream2", "1"} {
		_, err := compat.ParseMode(bad)
		if err == nil || !strings.Contains(err.Error(), "upstream, legacy, drainer, legacy-autodrain") {
			t.Errorf("ParseMode(%q) = %v, want an error naming the valid values", bad, err)
		}
	}
}

func TestModeFromEnv(t *testing.T) {
	for env, want := range map[string]compat.Mode{"": compat.Upstream, "  ": compat.Upstream, "drainer": compat.Drainer, "LEGACY": compat.Legacy, "legacy-autodrain": compat.LegacyAutoDrain} {
		t.Setenv(compat.EnvVar, env)
		if got, err := compat.ModeFromEnv(); err != nil || got != want {
			t.Errorf("%s=%q: ModeFromEnv = %v, %v; want %v", compat.EnvVar, env, got, err, want)
		}
	}
	t.Setenv(compat.EnvVar, "dranier")
	if _, err := compat.ModeFromEnv(); err == nil || !strings.Contains(err.Error(), compat.EnvVar) {
		t.Fatalf("a bad %s = %v, want an error naming the variable", compat.EnvVar, err)
	}
}

// TestDialInEveryMode dials the broker in each mode, honouring the config
// (heartbeat, properties, recovery), and does one round trip.
func TestDialInEveryMode(t *testing.T) {
	for _, mode := range []compat.Mode{compat.Upstream, compat.Legacy, compat.Drainer, compat.LegacyAutoDrain} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := amqp.Config{
				Heartbeat:  5 * time.Second,
				Properties: amqp.Table{"connection_name": "compat-" + mode.String()},
				Recovery:   &amqp.Recovery{},
			}
			conn, err := compat.DialConfig(testenv.AMQPURL(t), cfg, mode,
				compat.WithDrainerOptions(amqp.DrainerOptions{Budget: 1 << 20}),
				compat.WithLegacyOptions(amqp.LegacyOptions{CloseTimeout: time.Second}))
			if err != nil {
				t.Fatal(err)
			}
			if got := conn.ReadMode(); got != mode.String() {
				t.Fatalf("ReadMode() = %q, want %q", got, mode)
			}
			if conn.Config.Heartbeat != 5*time.Second || !conn.IsRecoveryEnabled() {
				t.Fatalf("the config was not honoured: heartbeat %s, recovery %v", conn.Config.Heartbeat, conn.IsRecoveryEnabled())
			}
			confirmAndConsume(t, conn)
			if err := conn.Close(); !errors.Is(err, amqp.ErrClosed) {
				t.Fatalf("second Close = %v, want ErrClosed", err)
			}
		})
	}
}

func TestDialRejectsAnUnknownMode(t *testing.T) {
	if _, err := compat.Dial("amqp://127.0.0.1:1/", compat.Mode(42)); err == nil {
		t.Fatal("Dial accepted Mode(42)")
	}
}

// TestWithBlockingRead: the drainer and upstream modes work over blocking reads, through
// DialConfig and DialContext alike, and the legacy modes refuse them with a reason.
func TestWithBlockingRead(t *testing.T) {
	for _, mode := range []compat.Mode{compat.Drainer, compat.Upstream} {
		t.Run(mode.String(), func(t *testing.T) {
			conn, err := compat.DialConfig(testenv.AMQPURL(t), amqp.Config{}, mode, compat.WithBlockingRead())
			if err != nil {
				t.Fatal(err)
			}
			confirmAndConsume(t, conn)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err = compat.DialContext(ctx, testenv.AMQPURL(t), mode, compat.WithBlockingRead())
			if err != nil {
				t.Fatal(err)
			}
			confirmAndConsume(t, conn)
		})
	}
	for _, mode := range []compat.Mode{compat.Legacy, compat.LegacyAutoDrain} {
		_, err := compat.Dial(testenv.AMQPURL(t), mode, compat.WithBlockingRead())
		if err == nil || !strings.Contains(err.Error(), "WithBlockingRead") {
			t.Errorf("%v with WithBlockingRead: %v, want a refusal that names it", mode, err)
		}
	}
}

// confirmAndConsume publishes a message with a confirm, gets it back, and closes conn.
func confirmAndConsume(t *testing.T, conn *amqp.Connection) {
	t.Helper()
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false,
		amqp.Publishing{Body: []byte("confirmed and got")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("confirm: %v, %v", ok, err)
	}
	// basic.get, not a Consume chan: an RPC reads its reply in every mode, legacy's too.
	d, ok, err := ch.Get(q.Name, true)
	if err != nil || !ok || string(d.Body) != "confirmed and got" {
		t.Fatalf("basic.get: %q, %v, %v", d.Body, ok, err)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
