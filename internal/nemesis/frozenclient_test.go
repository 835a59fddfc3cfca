package nemesis

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The workload's process is frozen (SIGSTOP) for four heartbeats, longer
// than the two after which the broker closes its connection, then thawed:
// it resumes with a dead connection, deliveries it held and confirms it
// waited for. Nothing confirmed is lost, in every mode.
func TestFrozenClient(t *testing.T) {
	for _, mode := range []compat.Mode{compat.Drainer, compat.LegacyAutoDrain, compat.Upstream} {
		t.Run(mode.String(), func(t *testing.T) { frozenClient(t, mode) })
	}
}

func frozenClient(t *testing.T, mode compat.Mode) {
	queue := durableQueue(t)
	w := Workload{URLs: []string{testenv.AMQPURL(t)}, Mode: mode, Queues: []string{queue}, Heartbeat: time.Second}
	child := startWorkload(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must(t, child.WaitConfirmed(ctx, 200))
	freeze := time.Now()
	must(t, child.Signal(syscall.SIGSTOP))
	hold(ctx, 4*w.Heartbeat)
	must(t, child.Signal(syscall.SIGCONT))
	thaw := time.Now()
	must(t, child.WaitConfirmed(ctx, child.Confirmed()+200))
	must(t, child.Stop(time.Minute))
	child.Add(drainEvents(t, queue)...)
	h, err := ReadHistory(bytes.NewReader(child.Events()), child.Start)
	if err != nil {
		t.Fatal(err)
	}
	s := Schedule{Options: Options{}.withDefaults(), Actions: []Action{
		{Kind: FreezeClient, Client: "workload", Start: freeze.Sub(child.Start), Hold: thaw.Sub(freeze)}}}
	rep := Check(h, s)
	t.Logf("%s: frozen %v; the first message published after the thaw confirmed %v after it; "+
		"%d published, %d confirmed, %d lost, %d duplicates, %d unconfirmed but delivered, failed %v; "+
		"longest confirm gap around the freeze %v; %s",
		mode, thaw.Sub(freeze).Round(time.Millisecond), firstConfirmOfNew(h, thaw).Round(time.Millisecond),
		rep.Published, rep.Confirmed, rep.Lost, rep.Duplicates, rep.UnconfirmedDelivered, rep.Failed,
		rep.LongestGap[FreezeClient].Round(time.Millisecond), child.ClientStats())
	if rep.Lost > 0 {
		t.Fatalf("%d confirmed messages lost:\n%v", rep.Lost, rep.LostHistories)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// startWorkload starts w in a child process (this test binary again, with
// WorkloadEnv set), which a test that fails early never leaves behind.
func startWorkload(t *testing.T, w Workload) *Proc {
	p, err := StartWorkload(w, os.Args[0], "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// durableQueue declares a queue of the test's own on the test broker.
func durableQueue(t *testing.T) string {
	conn := testenv.Dial(t, amqp.Config{})
	ch := testenv.Channel(t, conn)
	name := fmt.Sprintf("nemesis-%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(name, false, false, false) })
	return name
}

// firstConfirmOfNew is how long after at the first message first
// published after at was confirmed (-1 if none was).
func firstConfirmOfNew(h History, at time.Time) time.Duration {
	first := time.Duration(-1)
	for _, m := range h.Messages {
		if m.Confirmed && len(m.Publishes) > 0 && !m.Publishes[0].At.Before(at) {
			if d := m.ConfirmedAt.Sub(at); first < 0 || d < first {
				first = d
			}
		}
	}
	return first
}

// drainEvents fetches what is left in queue on the test broker, as got
// events.
func drainEvents(t *testing.T, queue string) []Event {
	ch := testenv.Channel(t, testenv.Dial(t, amqp.Config{}))
	es, err := Drain(ch, queue)
	if err != nil {
		t.Fatal(err)
	}
	return es
}
