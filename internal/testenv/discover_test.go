package testenv

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// env is a fake environment for probes.getenv.
type env map[string]string

func (e env) get(k string) string { return e[k] }

// noContainer is a container probe that must not be reached.
func noContainer(t *testing.T) func() (broker, error) {
	return func() (broker, error) {
		t.Error("discovery tried testcontainers although an earlier source should have won")
		return broker{}, errors.New("unexpected")
	}
}

// dialOnly answers on the given addresses and refuses everything else,
// recording what was dialled.
func dialOnly(dialled *[]string, up ...string) func(string, time.Duration) error {
	return func(addr string, _ time.Duration) error {
		*dialled = append(*dialled, addr)
		for _, u := range up {
			if addr == u {
				return nil
			}
		}
		return errors.New("connection refused")
	}
}

func TestDiscoverAMQPURLOverride(t *testing.T) {
	var dialled []string
	b, err := discover(probes{
		getenv:    env{"AMQP_URL": "amqp://u:p@broker.test:5673/vh"}.get,
		dial:      dialOnly(&dialled, "broker.test:5673", localAddr),
		container: noContainer(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := broker{
		amqpURL:  "amqp://u:p@broker.test:5673/vh",
		amqpAddr: "broker.test:5673",
		mgmtURL:  "http://broker.test:15672",
		source:   "broker at AMQP_URL",
	}
	if b != want {
		t.Errorf("discover = %+v, want %+v", b, want)
	}
	// The local broker answers too, but an explicit AMQP_URL wins.
	if len(dialled) != 1 {
		t.Errorf("dialled %q, want only AMQP_URL's address", dialled)
	}
}

func TestDiscoverManagementOverride(t *testing.T) {
	var dialled []string
	b, err := discover(probes{
		getenv: env{
			"AMQP_URL":                "amqps://u:p@broker.test/",
			"RABBITMQ_MANAGEMENT_URL": "https://mgmt.test:8443/",
		}.get,
		dial:      dialOnly(&dialled, "broker.test:5671"),
		container: noContainer(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.amqpAddr != "broker.test:5671" {
		t.Errorf("amqpAddr = %q, want the amqps default port", b.amqpAddr)
	}
	if b.mgmtURL != "https://mgmt.test:8443" {
		t.Errorf("mgmtURL = %q, want RABBITMQ_MANAGEMENT_URL without its trailing slash", b.mgmtURL)
	}
}

// TestDiscoverAMQPURLReal sets AMQP_URL for real and probes the running
// broker with a real TCP dial.
func TestDiscoverAMQPURLReal(t *testing.T) {
	u := "amqp://guest:guest@" + localAddr + "/"
	if v := os.Getenv("AMQP_URL"); v != "" {
		u = v // point it at whatever broker this run uses
	}
	t.Setenv("AMQP_URL", u)
	b, err := discover(probes{getenv: os.Getenv, dial: systemProbes.dial, container: noContainer(t)})
	if err != nil {
		t.Fatal(err)
	}
	if b.amqpURL != u || b.source != "broker at AMQP_URL" {
		t.Errorf("discover = %+v, want AMQP_URL %s", b, u)
	}
}

func TestDiscoverAMQPURLNotAnswering(t *testing.T) {
	// A port that was just free is the most reliable "nothing there".
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	t.Setenv("AMQP_URL", "amqp://guest:secret@"+addr+"/")
	_, err = discover(probes{getenv: os.Getenv, dial: systemProbes.dial, container: noContainer(t)})
	if err == nil {
		t.Fatal("discover succeeded with AMQP_URL pointing at a closed port")
	}
	msg := err.Error()
	for _, want := range []string{"AMQP_URL", addr, "unset AMQP_URL"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "secret") {
		t.Errorf("message leaks the password:\n%s", msg)
	}
}

func TestDiscoverAMQPURLInvalid(t *testing.T) {
	var dialled []string
	_, err := discover(probes{
		getenv:    env{"AMQP_URL": "http://127.0.0.1:5672/"}.get,
		dial:      dialOnly(&dialled, localAddr),
		container: noContainer(t),
	})
	if err == nil || !strings.Contains(err.Error(), "AMQP_URL") {
		t.Fatalf("err = %v, want one naming AMQP_URL", err)
	}
	if len(dialled) != 0 {
		t.Errorf("dialled %q for an invalid AMQP_URL", dialled)
	}
}

// TestDiscoverLocalBroker needs the broker on 127.0.0.1:5672 that this
// repository's tests are normally run against.
func TestDiscoverLocalBroker(t *testing.T) {
	b, err := discover(probes{getenv: env{}.get, dial: systemProbes.dial, container: noContainer(t)})
	if err != nil {
		t.Fatalf("%v\n(this test expects a broker on %s)", err, localAddr)
	}
	want := broker{amqpURL: localURL, amqpAddr: localAddr, mgmtURL: localMgmt, source: "local broker"}
	if b != want {
		t.Errorf("discover = %+v, want %+v", b, want)
	}
}

func TestDiscoverContainer(t *testing.T) {
	var dialled []string
	ctr := broker{
		amqpURL:  "amqp://guest:guest@localhost:32768/",
		amqpAddr: "localhost:32768",
		mgmtURL:  "http://localhost:32769",
		source:   "testcontainers broker x",
	}
	b, err := discover(probes{
		getenv:    env{}.get,
		dial:      dialOnly(&dialled),
		container: func() (broker, error) { return ctr, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if b != ctr {
		t.Errorf("discover = %+v, want the container's %+v", b, ctr)
	}
}

func TestDiscoverNothingFound(t *testing.T) {
	var dialled []string
	_, err := discover(probes{
		getenv:    env{"RABBITMQ_IMAGE": "rabbitmq:custom"}.get,
		dial:      dialOnly(&dialled),
		container: func() (broker, error) { return broker{}, errors.New("no Docker engine: boom") },
	})
	if err == nil {
		t.Fatal("discover succeeded with nothing available")
	}
	want := `testenv: no RabbitMQ broker for the integration tests. Tried, in order:
  1. AMQP_URL: not set
  2. a local broker at 127.0.0.1:5672: connection refused
  3. a testcontainers broker (rabbitmq:custom): no Docker engine: boom
Provide one of:
  - a local broker:    rabbitmq-server -detached && rabbitmq-plugins enable rabbitmq_management
  - any other broker:  export AMQP_URL=amqp://user:password@host:5672/vhost
  - a Docker engine, for testcontainers to run RABBITMQ_IMAGE (default rabbitmq:4.3-management)`
	if got := err.Error(); got != want {
		t.Errorf("message:\n%s\n\nwant:\n%s", got, want)
	}
}

// TestDockerHealthReturns checks that the Docker probe answers within its
// bound and does not panic, whether or not this machine has Docker.
func TestDockerHealthReturns(t *testing.T) {
	const timeout = 2 * time.Second
	start := time.Now()
	err := dockerHealth(timeout)
	if d := time.Since(start); d > timeout+time.Second {
		t.Errorf("dockerHealth took %v, bound is %v", d, timeout)
	}
	t.Logf("dockerHealth: %v", err)
}

func TestAtExitNeedsMain(t *testing.T) {
	if err := AtExit(func() {}); err != nil {
		t.Fatalf("AtExit under Main: %v", err)
	}

	exit.mu.Lock()
	exit.active = false
	exit.mu.Unlock()
	defer func() {
		exit.mu.Lock()
		exit.active = true
		exit.mu.Unlock()
	}()
	err := AtExit(func() { t.Error("AtExit ran a function it refused") })
	if err == nil || !strings.Contains(err.Error(), "testenv.Main(m)") {
		t.Errorf("AtExit without Main: err = %v, want one showing how to call testenv.Main", err)
	}
}
