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
	"strings"
	"sync"
	"syscall"
	"time"
)

// WorkloadEnv, when set in a process's environment, holds a Workload
// (JSON) that the process is to run: see MaybeRunWorkload.
const WorkloadEnv = "NEMESIS_WORKLOAD"

// MaybeRunWorkload is the workload process's main. A binary that starts
// workloads (the chaos command, this package's tests) calls it first
// thing: when WorkloadEnv is set it runs that workload until SIGTERM,
// with its events on stdout, and exits; otherwise it returns.
func MaybeRunWorkload() {
	cfg := os.Getenv(WorkloadEnv)
	if cfg == "" {
		return
	}
	var w Workload
	if err := json.Unmarshal([]byte(cfg), &w); err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	err := w.Run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Proc is a workload running in a process of its own, its events read
// as they come.
type Proc struct {
	cmd    *exec.Cmd
	Start  time.Time // when the process started
	stderr bytes.Buffer
	done   chan struct{} // the events ended (the child closed stdout)

	mu   sync.Mutex
	log  bytes.Buffer
	oks  []time.Time
	more chan struct{} // closed and replaced at each confirm
}

// StartWorkload starts w in a child process: argv (this binary again, by
// default os.Args[0] alone) with WorkloadEnv set; argv's binary must call
// MaybeRunWorkload.
func StartWorkload(w Workload, argv ...string) (*Proc, error) {
	cfg, err := json.Marshal(w)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		argv = []string{os.Args[0]}
	}
	p := &Proc{cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{}), more: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), WorkloadEnv+"="+string(cfg))
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.Start = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go p.read(out)
	return p, nil
}

// read keeps the child's events, and notes each confirm's time.
func (p *Proc) read(out io.Reader) {
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

// Confirmed is how many publishes were confirmed so far.
func (p *Proc) Confirmed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.oks)
}

// WaitConfirmed waits until n publishes were confirmed, bounded by ctx.
func (p *Proc) WaitConfirmed(ctx context.Context, n int) error {
	for {
		p.mu.Lock()
		got, more := len(p.oks), p.more
		p.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-more:
		case <-p.done:
			return fmt.Errorf("nemesis: the workload ended with %d of %d confirmed: %s", got, n, p.stderr.String())
		case <-ctx.Done():
			return fmt.Errorf("nemesis: %d of %d confirmed when the bound ran out: %w", got, n, ctx.Err())
		}
	}
}

// Signal sends sig to the workload's process: SIGSTOP freezes it.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop ends the workload (SIGTERM: it settles and closes its clients)
// and waits for it, up to within.
func (p *Proc) Stop(within time.Duration) error {
	_ = p.Signal(syscall.SIGCONT) // a frozen process cannot end
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(within):
		p.Kill()
		return fmt.Errorf("nemesis: the workload still ran %v after SIGTERM; killed", within)
	}
	if err := p.cmd.Wait(); err != nil {
		return fmt.Errorf("nemesis: workload: %w: %s", err, strings.TrimSpace(p.stderr.String()))
	}
	return nil
}

// Kill ends the process at once and waits for it: for a run that failed
// early, so that no child outlives it.
func (p *Proc) Kill() {
	_ = p.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.cmd.Wait()
}

// Add appends events to the record, such as the drained messages.
func (p *Proc) Add(es ...Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range es {
		b, _ := json.Marshal(e)
		p.log.Write(append(b, '\n'))
	}
}

// Events is the record so far, as JSON lines.
func (p *Proc) Events() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Clone(p.log.Bytes())
}

// ClientStats is the workload's end event's counters, one client a line.
func (p *Proc) ClientStats() string {
	for _, line := range bytes.Split(p.Events(), []byte("\n")) {
		var e Event
		if json.Unmarshal(line, &e) == nil && e.End != nil {
			return strings.Join(e.End.Stats, "\n")
		}
	}
	return "no stats"
}
