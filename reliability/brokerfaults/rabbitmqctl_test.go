package brokerfaults

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ctlEnvVar names the command that runs rabbitmqctl against the test
// broker, split on spaces: for a broker in a container, for instance,
// RABBITMQCTL="docker exec my-rabbit rabbitmqctl". Unset, rabbitmqctl on
// PATH is used.
const ctlEnvVar = "RABBITMQCTL"

// ctlTimeout bounds one rabbitmqctl run: each starts an Erlang VM, which
// takes a second or more on a loaded machine.
const ctlTimeout = 2 * time.Minute

// ctl runs rabbitmqctl commands against the test broker.
type ctl struct{ argv []string }

// needCtl returns the rabbitmqctl of the test broker, or skips t saying
// how to provide one. It checks that the command reaches the node the
// management API reports, so that a local rabbitmqctl never raises an
// alarm on some other broker than the one under test.
func needCtl(t *testing.T, api *mgmt) *ctl {
	t.Helper()
	how := fmt.Sprintf("put rabbitmqctl on PATH, or set %s to a command that runs it against the test broker "+
		"(for example %s=\"docker exec <container> rabbitmqctl\" or %s=\"rabbitmqctl -n rabbit@host\")",
		ctlEnvVar, ctlEnvVar, ctlEnvVar)
	var c ctl
	if v := os.Getenv(ctlEnvVar); strings.TrimSpace(v) != "" {
		c.argv = strings.Fields(v)
	} else if p, err := exec.LookPath("rabbitmqctl"); err == nil {
		c.argv = []string{p}
	} else {
		t.Skipf("this test drives the broker with rabbitmqctl, which is not on PATH: to run it, %s", how)
	}
	want, err := api.node()
	if err != nil {
		t.Fatalf("management API: %v", err)
	}
	got, err := c.run("eval", "node().")
	if err != nil {
		t.Skipf("%q does not answer (%v): to run this test, %s", strings.Join(c.argv, " "), err, how)
	}
	if got = strings.Trim(got, "'"); got != want {
		t.Skipf("%q reaches node %s, but the test broker is %s: to run this test, %s",
			strings.Join(c.argv, " "), got, want, how)
	}
	return &c
}

// run runs one rabbitmqctl command and returns its output, trimmed.
func (c *ctl) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	argv := append(append([]string(nil), c.argv[1:]...), args...)
	out, err := exec.CommandContext(ctx, c.argv[0], argv...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", strings.Join(c.argv, " "), strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// absoluteWatermark matches get_vm_memory_high_watermark's answer for a
// watermark set in bytes: {absolute,1073741824} or {absolute,"1GB"}.
var absoluteWatermark = regexp.MustCompile(`^\{absolute,\s*"?([0-9A-Za-z.]+)"?\}$`)

// watermarkArgs reads the broker's memory high watermark and returns the
// set_vm_memory_high_watermark arguments that restore it. It refuses a
// watermark of 0, or an alarm already in effect: either means someone
// else's alarm (or a killed run of this test) that restoring to it would
// make permanent.
func (c *ctl) watermarkArgs(t *testing.T) []string {
	t.Helper()
	const fix = "restore the broker with: rabbitmqctl set_vm_memory_high_watermark 0.4 (RabbitMQ's default)"
	out, err := c.run("eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	if m := absoluteWatermark.FindStringSubmatch(out); m != nil {
		args = []string{"set_vm_memory_high_watermark", "absolute", m[1]}
	} else if f, err := strconv.ParseFloat(out, 64); err == nil && f > 0 {
		args = []string{"set_vm_memory_high_watermark", out}
	} else {
		t.Fatalf("the broker's memory high watermark is %q, which this test cannot restore or which is already an alarm; %s", out, fix)
	}
	if on, err := c.memoryAlarm(); err != nil || on {
		t.Fatalf("a memory alarm is already in effect (%v), and this test must not lift someone else's; %s", err, fix)
	}
	return args
}

// memoryAlarm reports whether a memory alarm is in effect on the node.
// (The management API's mem_alarm lags by its statistics interval.)
func (c *ctl) memoryAlarm() (bool, error) {
	out, err := c.run("eval", "rabbit_alarm:get_alarms().")
	if err != nil {
		return false, err
	}
	return strings.Contains(out, "memory"), nil
}

// alarmMax bounds how long one memory alarm may stay raised if a test
// hangs: a watchdog lifts it then, so that a stuck test cannot leave
// every publisher on the broker blocked.
const alarmMax = 3 * time.Minute

// An alarm raises the broker's memory alarm and guarantees it is lifted.
type alarm struct {
	ctl     *ctl
	restore []string // set_vm_memory_high_watermark arguments

	mu       sync.Mutex
	raised   bool
	watchdog *time.Timer
}

// raise sets the watermark to 0, which raises the memory alarm at once.
// Before it does, it registers the Cleanup that lifts the alarm, so that
// it is lifted whether the test passes, fails or is skipped, and arms a
// watchdog that lifts it should the test hang until it is killed (a
// killed test runs no Cleanup).
func (a *alarm) raise(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		if err := a.lift(); err != nil {
			t.Errorf("lifting the memory alarm: %v", err)
			return
		}
		a.awaitCleared(t)
	})
	limit := alarmMax
	if d, ok := t.Deadline(); ok {
		limit = min(limit, time.Until(d)/2)
	}
	a.mu.Lock()
	a.raised = true
	a.watchdog = time.AfterFunc(limit, func() { _ = a.lift() })
	a.mu.Unlock()
	if _, err := a.ctl.run("set_vm_memory_high_watermark", "0"); err != nil {
		t.Fatalf("raising the memory alarm: %v", err)
	}
}

// lift restores the watermark the broker had before raise. It is
// idempotent, and safe to call from the watchdog and the test at once.
func (a *alarm) lift() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.raised {
		return nil
	}
	if a.watchdog != nil {
		a.watchdog.Stop()
	}
	if _, err := a.ctl.run(a.restore...); err != nil {
		return err
	}
	a.raised = false
	return nil
}

// awaitCleared waits (within bound) until the broker has cleared the
// alarm after lift, so the next test, or the next package, does not
// start under it.
func (a *alarm) awaitCleared(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(bound)
	tick := time.NewTicker(200 * time.Millisecond) // paces the retries of a failing command
	defer tick.Stop()
	for ; ; <-tick.C {
		on, err := a.ctl.memoryAlarm()
		if err == nil && !on {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("the broker still reports a memory alarm (%v) %v after the watermark was restored", err, bound)
			return
		}
	}
}

// fatalf lifts the alarm, then fails t: a failure is reported with the
// broker already back to normal, and the Cleanup's lift is then a no-op.
func (a *alarm) fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	if err := a.lift(); err != nil {
		t.Errorf("lifting the memory alarm: %v", err)
	}
	t.Fatalf(format, args...)
}

// connectionPid returns the broker's process id of conn, which
// rabbitmqctl close_connection takes: the connection whose peer port is
// conn's local port. rabbitmqctl lists a connection as soon as it is
// open, unlike the management API.
func (c *ctl) connectionPid(t *testing.T, conn *amqp.Connection) string {
	t.Helper()
	addr, ok := conn.LocalAddr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("local address %v is not TCP", conn.LocalAddr())
	}
	out, err := c.run("list_connections", "-s", "pid", "peer_port")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == strconv.Itoa(addr.Port) {
			return f[0]
		}
	}
	t.Fatalf("rabbitmqctl list_connections shows no connection from port %d:\n%s", addr.Port, out)
	return ""
}
