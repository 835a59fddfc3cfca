package compat_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// The process-wide switch reads AMQP091_READ_MODE once per process, so each
// value is tried in a child process: this test binary, re-run with only
// TestProcessSwitchChild selected.
const (
	childEnv = "COMPAT_SWITCH_CHILD" // set: this process is a child
	wantEnv  = "COMPAT_SWITCH_WANT"  // a read mode, or "error:" and a part of the message
)

// TestProcessSwitch: a plain amqp.Dial, with no Config.ReadPath and no
// compat call, runs in the mode AMQP091_READ_MODE names, and refuses to
// dial at all when it names plain legacy or nothing valid.
func TestProcessSwitch(t *testing.T) {
	url := testenv.AMQPURL(t)
	unset := "\x00unset"
	for env, want := range map[string]string{
		unset:              "upstream",
		"":                 "upstream",
		"upstream":         "upstream",
		"drainer":          "drainer",
		"legacy-autodrain": "legacy-autodrain",
		"legacy":           "error:would hang",
		"garbage":          `error:want one of "upstream" (or unset or empty), "drainer", "legacy-autodrain"`,
	} {
		name := env
		if env == unset {
			name = "unset"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestProcessSwitchChild$", "-test.count=1", "-test.v")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, compat.EnvVar+"=") && !strings.HasPrefix(kv, "AMQP091_DRAINER_TEST_READ_MODE=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, childEnv+"=1", wantEnv+"="+want, "AMQP_URL="+url)
			if env != unset {
				cmd.Env = append(cmd.Env, compat.EnvVar+"="+env)
			}
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- PASS: TestProcessSwitchChild") {
				t.Fatalf("child with %s=%q: %v\n%s", compat.EnvVar, env, err, out)
			}
		})
	}
}

// TestProcessSwitchChild runs only in a child of TestProcessSwitch.
func TestProcessSwitchChild(t *testing.T) {
	want, ok := os.LookupEnv(wantEnv)
	if os.Getenv(childEnv) == "" || !ok {
		t.Skip("runs as a child of TestProcessSwitch")
	}
	url := os.Getenv("AMQP_URL")
	if part, isErr := strings.CutPrefix(want, "error:"); isErr {
		childRefuses(t, url, part)
		return
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := conn.ReadMode(); got != want {
		t.Fatalf("amqp.Dial: ReadMode() = %q, want %q", got, want)
	}
	if want == "legacy-autodrain" {
		receiveWithoutDraining(t, conn)
	}
	// Read once per process: a later change of the variable is not seen.
	t.Setenv(compat.EnvVar, "garbage")
	again, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("the variable was read again: %v", err)
	}
	defer again.Close()
	if got := again.ReadMode(); got != want {
		t.Fatalf("second amqp.Dial: ReadMode() = %q, want %q", got, want)
	}
	// Code beats the environment.
	explicit, err := compat.Dial(url, compat.Upstream)
	if err != nil {
		t.Fatal(err)
	}
	defer explicit.Close()
	if got := explicit.ReadMode(); got != "upstream" {
		t.Fatalf("compat.Dial(url, compat.Upstream): ReadMode() = %q", got)
	}
}

// childRefuses: with an invalid AMQP091_READ_MODE every Dial and Open
// fails with ErrInvalidReadMode and a message containing part, and closes
// the socket it was given; a Config.ReadPath or a programmatic default
// still dials.
func childRefuses(t *testing.T, url, part string) {
	for i := 0; i < 2; i++ { // every dial, not only the first
		conn, err := amqp.Dial(url)
		if !errors.Is(err, amqp.ErrInvalidReadMode) || !strings.Contains(err.Error(), part) || !strings.Contains(err.Error(), compat.EnvVar) {
			t.Fatalf("amqp.Dial = %v, want ErrInvalidReadMode naming %s and saying %q", err, compat.EnvVar, part)
		}
		if conn != nil && !conn.IsClosed() {
			t.Fatal("amqp.Dial returned an open connection with its error")
		}
	}
	ours, theirs := net.Pipe()
	defer theirs.Close()
	if _, err := amqp.Open(ours, amqp.Config{}); !errors.Is(err, amqp.ErrInvalidReadMode) {
		t.Fatalf("amqp.Open = %v, want ErrInvalidReadMode", err)
	}
	_ = theirs.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := theirs.Read(make([]byte, 8)); !errors.Is(err, io.EOF) {
		t.Fatalf("Open left its transport open (the peer's read: %v)", err)
	}

	conn, err := amqp.DialConfig(url, amqp.Config{ReadPath: amqp.Drainer(amqp.DrainerOptions{})})
	if err != nil {
		t.Fatalf("Config.ReadPath set: %v", err)
	}
	defer conn.Close()

	amqp.SetDefaultReadPath(amqp.Drainer(amqp.DrainerOptions{}))
	conn2, err := amqp.Dial(url)
	amqp.SetDefaultReadPath(nil)
	if err != nil {
		t.Fatalf("with SetDefaultReadPath: %v", err)
	}
	defer conn2.Close()
	if got := conn2.ReadMode(); got != "drainer" {
		t.Fatalf("with SetDefaultReadPath(Drainer): ReadMode() = %q", got)
	}
	if _, err := amqp.Dial(url); !errors.Is(err, amqp.ErrInvalidReadMode) {
		t.Fatalf("after SetDefaultReadPath(nil): amqp.Dial = %v, want the variable's error again", err)
	}
}

// receiveWithoutDraining: in legacy-autodrain mode deliveries and
// confirmations reach their chans while nobody calls DrainEvents or waits
// on a DeferredConfirmation (which would read frames itself).
func receiveWithoutDraining(t *testing.T, conn *amqp.Connection) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 10))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	for i := 0; i < n; i++ {
		if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false, amqp.Publishing{Body: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	timeout := time.After(10 * time.Second)
	for got, acked := 0, 0; got < n || acked < n; {
		select {
		case d := <-deliveries:
			if d.Body[0] != byte(got) {
				t.Fatalf("delivery %d has body %v", got, d.Body)
			}
			got++
		case c := <-confirms:
			if !c.Ack {
				t.Fatalf("confirmation %d nacked", c.DeliveryTag)
			}
			acked++
		case <-timeout:
			t.Fatalf("after 10 s with nobody draining: %d of %d deliveries, %d of %d confirmations", got, n, acked, n)
		}
	}
}

// TestSetDefaultReadPathWithBroker: the programmatic default reaches a
// plain amqp.Dial; Config.ReadPath, and compat's explicit Upstream, win
// over it.
func TestSetDefaultReadPathWithBroker(t *testing.T) {
	url := testenv.AMQPURL(t)
	amqp.SetDefaultReadPath(amqp.Drainer(amqp.DrainerOptions{}))
	defer amqp.SetDefaultReadPath(nil)
	for _, tc := range []struct {
		name string
		dial func() (*amqp.Connection, error)
		want string
	}{
		{"amqp.Dial", func() (*amqp.Connection, error) { return amqp.Dial(url) }, "drainer"},
		{"amqp.DialConfig, Config.ReadPath legacy", func() (*amqp.Connection, error) {
			return amqp.DialConfig(url, amqp.Config{ReadPath: amqp.Legacy(amqp.LegacyOptions{})})
		}, "legacy"},
		{"compat.Dial upstream", func() (*amqp.Connection, error) { return compat.Dial(url, compat.Upstream) }, "upstream"},
		{"compat.Dial legacy-autodrain", func() (*amqp.Connection, error) { return compat.Dial(url, compat.LegacyAutoDrain) }, "legacy-autodrain"},
	} {
		conn, err := tc.dial()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := conn.ReadMode()
		if err := conn.Close(); err != nil {
			t.Fatalf("%s: Close: %v", tc.name, err)
		}
		if got != tc.want {
			t.Fatalf("%s: ReadMode() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestLegacyAutoDrain: compat.LegacyAutoDrain receives deliveries and
// confirmations with nobody draining, and Close leaves no goroutine.
func TestLegacyAutoDrain(t *testing.T) {
	url := testenv.AMQPURL(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	conn, err := compat.Dial(url, compat.LegacyAutoDrain)
	if err != nil {
		t.Fatal(err)
	}
	if got := conn.ReadMode(); got != "legacy-autodrain" {
		t.Fatalf("ReadMode() = %q", got)
	}
	receiveWithoutDraining(t, conn)
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := conn.DrainEvents(context.Background()); !errors.Is(err, amqp.ErrClosedIntentionally) {
		t.Fatalf("DrainEvents after Close = %v, want ErrClosedIntentionally", err)
	}
}
