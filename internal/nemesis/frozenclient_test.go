package nemesis

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	amqp "github.com/rabbitmq/amqp091-go"
)

// workloadEnv, when set, makes the test binary run the Workload it holds
// (JSON) instead of the tests: the frozen-client test's child process.
const workloadEnv = "NEMESIS_WORKLOAD"

// runWorkload is the child's main: the workload until SIGTERM, its events
// on stdout.
func runWorkload(cfg string) int {
	var w Workload
	if err := json.Unmarshal([]byte(cfg), &w); err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := w.Run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		return 1
	}
	return 0
}

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
	w := Workload{URL: testenv.AMQPURL(t), Mode: mode, Queue: queue, Heartbeat: time.Second}
	child := startWorkload(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	child.waitConfirmed(t, ctx, 200)
	freeze := time.Now()
	child.signal(t, syscall.SIGSTOP)
	hold(ctx, 4*w.Heartbeat)
	child.signal(t, syscall.SIGCONT)
	thaw := time.Now()
	child.waitConfirmed(t, ctx, child.confirmed()+200)
	child.stop(t)
	child.drain(t, queue)
	h, err := ReadHistory(bytes.NewReader(child.events()), child.start)
	if err != nil {
		t.Fatal(err)
	}
	s := Schedule{Options: Options{}.withDefaults(), Actions: []Action{
		{Kind: FreezeClient, Client: "workload", Start: freeze.Sub(child.start), Hold: thaw.Sub(freeze)}}}
	rep := Check(h, s)
	t.Logf("%s: frozen %v; the first message published after the thaw confirmed %v after it; "+
		"%d published, %d confirmed, %d lost, %d duplicates, %d unconfirmed but delivered, failed %v; "+
		"longest confirm gap around the freeze %v; %s",
		mode, thaw.Sub(freeze).Round(time.Millisecond), firstConfirmOfNew(h, thaw).Round(time.Millisecond),
		rep.Published, rep.Confirmed, rep.Lost, rep.Duplicates, rep.UnconfirmedDelivered, rep.Failed,
		rep.LongestGap[FreezeClient].Round(time.Millisecond), child.stats())
	if rep.Lost > 0 {
		t.Fatalf("%d confirmed messages lost:\n%v", rep.Lost, rep.LostHistories)
	}
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

// workloadProc is a workload running in a child process, its events
// read as they come.
type workloadProc struct {
	cmd    *exec.Cmd
	start  time.Time
	stderr bytes.Buffer
	done   chan struct{} // the events ended (the child closed stdout)

	mu   sync.Mutex
	log  bytes.Buffer
	oks  []time.Time
	more chan struct{} // closed and replaced at each confirm
}

// startWorkload starts w in a child process (this test binary again, with
// workloadEnv set).
func startWorkload(t *testing.T, w Workload) *workloadProc {
	cfg, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	p := &workloadProc{cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{}),
		more: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), workloadEnv+"="+string(cfg))
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // a test that failed early: never leave the child
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
		_ = p.cmd.Wait()
	})
	go p.read(out)
	return p
}

// read keeps the child's events, and notes each confirm's time.
func (p *workloadProc) read(out io.Reader) {
	defer close(p.done)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var e Event
		_ = json.Unmarshal(sc.Bytes(), &e)
		p.mu.Lock()
		p.log.Write(sc.Bytes())
		p.log.WriteByte('\n')
		if e.Kind == "ok" {
			p.oks = append(p.oks, time.Unix(0, e.T))
			close(p.more)
			p.more = make(chan struct{})
		}
		p.mu.Unlock()
	}
}

func (p *workloadProc) confirmed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.oks)
}

// waitConfirmed waits until n messages were confirmed, bounded by ctx.
func (p *workloadProc) waitConfirmed(t *testing.T, ctx context.Context, n int) {
	for {
		p.mu.Lock()
		got, more := len(p.oks), p.more
		p.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-more:
		case <-p.done:
			t.Fatalf("the workload ended with %d of %d confirmed: %s", got, n, p.stderr.String())
		case <-ctx.Done():
			t.Fatalf("%d of %d confirmed when the bound ran out", got, n)
		}
	}
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

// stats is the workload's last line: its clients' counters.
func (p *workloadProc) stats() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, line := range bytes.Split(p.log.Bytes(), []byte("\n")) {
		var e Event
		if json.Unmarshal(line, &e) == nil && e.Kind == "stats" {
			return e.Err
		}
	}
	return "no stats"
}

func (p *workloadProc) signal(t *testing.T, sig syscall.Signal) {
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// stop ends the workload (SIGTERM: it settles and closes) and waits.
func (p *workloadProc) stop(t *testing.T) {
	p.signal(t, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("the workload still ran a minute after SIGTERM")
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("workload: %v: %s", err, p.stderr.String())
	}
}

// drain fetches what is left in queue, as got events.
func (p *workloadProc) drain(t *testing.T, queue string) {
	ch := testenv.Channel(t, testenv.Dial(t, amqp.Config{}))
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return
		}
		b, _ := json.Marshal(Event{Kind: "got", ID: d.MessageId, T: time.Now().UnixNano()})
		p.mu.Lock()
		p.log.Write(append(b, '\n'))
		p.mu.Unlock()
	}
}

func (p *workloadProc) events() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Clone(p.log.Bytes())
}
