package nemesis

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/clusterfaults"
)

// RunOptions configure Run: one seed's schedule on a cluster, against one
// workload process per read mode, all at once, so that every mode meets
// the same faults at the same moments.
type RunOptions struct {
	Cluster *cluster.Cluster
	Seed    uint64
	// Options shape the schedule; Run names the clients (Clients and
	// Processes) after the modes' workloads.
	Options Options
	Modes   []compat.Mode
	// Workload is every mode's workload, but for its Mode, Queues, URLs,
	// ClusterDir and ClientIPs, which Run sets.
	Workload Workload
	// Argv starts a workload process (see StartWorkload); default this
	// binary.
	Argv []string
	// Resume bounds, after the last heal, the wait for every workload to
	// confirm again; default 2 minutes.
	Resume time.Duration
	// Logf, if set, gets the schedule and the faults as they happen.
	Logf func(format string, args ...any)
}

// RunResult is what a run did: the schedule as drawn and as it ran (the
// faults' real times: a node fault waits for the last one's heal, so that
// at most one node is ever out), what happened to each fault, and each
// mode's record and verdict.
type RunResult struct {
	Start        time.Time // the schedules' time 0
	Planned, Ran Schedule
	Faults       []string // one line per fault: applied, healed, notes, errors
	Modes        []ModeResult
}

// ModeResult is one mode's workload's record and the checker's verdict.
type ModeResult struct {
	Mode    compat.Mode
	Events  []byte // JSON lines (Event), the drained messages included
	History History
	Report  Report
	Stats   string // the clients' counters at their end
	// Stuck says why the workload did not confirm again after the last
	// heal, within RunOptions.Resume; "" when it did. A stuck workload
	// fails the run as a loss does: nothing may hang.
	Stuck string
}

// Run draws o.Seed's schedule, starts a workload per mode, applies the
// schedule, heals everything, waits for every workload to confirm again,
// stops the workloads (they settle their confirms and close), drains
// every queue and checks each mode's record. A failure to set up ends the
// run; a fault that fails to apply or heal is recorded in Faults and the
// run goes on, so that one fault's trouble does not cost the rest.
func Run(ctx context.Context, o RunOptions) (RunResult, error) {
	r := &runner{o: o, logf: o.Logf}
	if r.logf == nil {
		r.logf = func(string, ...any) {}
	}
	if r.o.Resume <= 0 {
		r.o.Resume = 2 * time.Minute
	}
	if err := r.setUp(ctx); err != nil {
		r.tearDown()
		return r.res, err
	}
	defer r.tearDown()
	r.logf("%s", r.res.Planned)
	r.apply(ctx)
	r.resume(ctx)
	err := r.finish(ctx)
	r.res.Faults = r.notes // the faults' lines, then any the end added
	return r.res, err
}

// runner holds one Run's state.
type runner struct {
	o     RunOptions
	logf  func(string, ...any)
	res   RunResult
	procs map[string]*Proc    // by workload name (the mode's)
	ips   map[string]string   // client name ("drainer/p1") → hub address
	queue map[string][]string // by workload name
	stuck map[string]string   // by workload name: see ModeResult.Stuck
	t0    time.Time

	mu    sync.Mutex
	ran   []Action
	notes []string
}

// setUp declares each mode's queues, gives each client an address, starts
// the workloads, waits until each has confirmed a first message, and
// draws the schedule.
func (r *runner) setUp(ctx context.Context) error {
	c := r.o.Cluster
	r.procs, r.ips, r.queue = map[string]*Proc{}, map[string]string{}, map[string][]string{}
	w := r.o.Workload.withDefaults()
	var clients, procs []string
	k := 0
	for _, mode := range r.o.Modes {
		name := mode.String()
		mw := w
		mw.Mode, mw.URLs, mw.ClusterDir, mw.ClientIPs = mode, c.URLs(), c.Dir(), map[string]string{}
		mw.Queues = nil
		for q := range max(w.Publishers, w.Consumers) {
			mw.Queues = append(mw.Queues, fmt.Sprintf("nemesis-%d-%s-q%d", r.o.Seed, name, q+1))
		}
		if err := r.declare(ctx, mw.Queues); err != nil {
			return err
		}
		r.queue[name] = mw.Queues
		for _, role := range clientNames(mw) {
			k++
			ip, err := c.AddClient(ctx, k)
			if err != nil {
				return err
			}
			mw.ClientIPs[role] = ip
			r.ips[name+"/"+role] = ip
			clients = append(clients, name+"/"+role)
		}
		procs = append(procs, name)
		p, err := StartWorkload(mw, r.o.Argv...)
		if err != nil {
			return err
		}
		r.procs[name] = p
	}
	for name, p := range r.procs {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := p.WaitConfirmed(wctx, 1)
		cancel()
		if err != nil {
			return fmt.Errorf("nemesis: %s's workload: %w", name, err)
		}
	}
	so := r.o.Options
	so.Clients, so.Processes = clients, procs
	r.res.Planned = Generate(r.o.Seed, so)
	r.t0 = time.Now()
	r.res.Start = r.t0
	return nil
}

// clientNames names w's clients: p1…, c1….
func clientNames(w Workload) []string {
	var names []string
	for k := range w.Publishers {
		names = append(names, fmt.Sprintf("p%d", k+1))
	}
	for k := range w.Consumers {
		names = append(names, fmt.Sprintf("c%d", k+1))
	}
	return names
}

// admin is a channel of the run's own, on a fresh connection to the
// first node that answers: for declaring, draining and deleting. Fresh
// each time, since a fault may have ended the last one.
func (r *runner) admin(ctx context.Context) (*amqp.Channel, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c := r.o.Cluster
	conn, err := compat.DialCluster(ctx, c.URLs(), compat.Upstream, compat.WithDialer(c.DialContext))
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return ch, func() { _ = conn.Close() }, nil
}

// declare declares quorum queues, empty.
func (r *runner) declare(ctx context.Context, queues []string) error {
	ch, done, err := r.admin(ctx)
	if err != nil {
		return err
	}
	defer done()
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return fmt.Errorf("nemesis: declare %s: %w", q, err)
		}
		if _, err := ch.QueuePurge(q, false); err != nil {
			return err
		}
	}
	return nil
}

// apply runs the schedule: each fault on time, held, healed. A node fault
// waits until the last node fault has healed, since a restart or rejoin
// can outlast its planned end, and two nodes out would break the bound.
func (r *runner) apply(ctx context.Context) {
	nodeOut := make(chan struct{}, 1) // a token: one node fault at a time
	var wg sync.WaitGroup
	for _, a := range r.res.Planned.Actions {
		wg.Go(func() {
			hold(ctx, time.Until(r.t0.Add(a.Start)))
			if _, isNode := a.out(); isNode {
				nodeOut <- struct{}{}
				defer func() { <-nodeOut }()
			}
			r.one(ctx, a)
		})
	}
	wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.Ran = Schedule{Seed: r.o.Seed, Options: r.res.Planned.Options, Actions: sortedByStart(r.ran)}
	// In the schedule's order: each line begins with its action's
	// planned start, right-aligned in a fixed width (Action.String).
	slices.Sort(r.notes)
}

// one applies a, holds it for its hold, and heals it.
func (r *runner) one(ctx context.Context, a Action) {
	start := time.Now()
	heal, err := Apply(ctx, r.o.Cluster, a, r.hooks())
	if err != nil {
		r.note("%v: not applied: %v", a, err)
		return
	}
	r.logf("nemesis %6.1fs: %s %s applied", time.Since(r.t0).Seconds(), a.Kind, a.target())
	hold(ctx, a.Hold)
	healStart := time.Now()
	note, err := heal(context.WithoutCancel(ctx))
	end := time.Now()
	ran := a
	ran.Start, ran.Hold = start.Sub(r.t0), end.Sub(start)
	r.mu.Lock()
	r.ran = append(r.ran, ran)
	r.mu.Unlock()
	r.note("%v: applied at %.1fs, healed at %.1fs (the heal took %.1fs)%s%s", a, ran.Start.Seconds(),
		ran.End().Seconds(), end.Sub(healStart).Seconds(), known("; ", note), errNote(err))
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	return "; heal failed: " + err.Error()
}

func (r *runner) note(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	r.logf("nemesis: %s", line)
	r.mu.Lock()
	r.notes = append(r.notes, line)
	r.mu.Unlock()
}

// hooks inject the client faults: a client's link cut in the cluster's
// routes, a workload's process frozen.
func (r *runner) hooks() Hooks {
	c := r.o.Cluster
	return Hooks{
		CutClientLink: func(_ context.Context, client string) (func() error, error) {
			ip, ok := r.ips[client]
			if !ok {
				return nil, fmt.Errorf("nemesis: no client %q", client)
			}
			return func() error { return c.RestoreClient(ip) }, c.CutClient(ip)
		},
		FreezeClient: func(_ context.Context, proc string) (func() error, error) {
			p, ok := r.procs[proc]
			if !ok {
				return nil, fmt.Errorf("nemesis: no workload %q", proc)
			}
			return func() error { return p.Signal(syscall.SIGCONT) }, p.Signal(syscall.SIGSTOP)
		},
	}
}

// resume makes sure everything is healed, the cluster runs whole, and
// every workload confirms again.
func (r *runner) resume(ctx context.Context) {
	c := r.o.Cluster
	if err := c.Heal(); err != nil {
		r.note("final heal: %v", err)
	}
	for _, ip := range r.ips {
		if err := c.RestoreClient(ip); err != nil {
			r.note("final restore of %s: %v", ip, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, r.o.Resume)
	defer cancel()
	if err := c.WaitRunning(wctx, 3); err != nil {
		r.note("after the schedule the cluster did not run whole: %v", err)
	}
	if parts, err := clusterfaults.Partitions(wctx, c); err != nil || len(parts) > 0 {
		r.note("after the schedule: partitions %v, err %v", parts, err)
	}
	r.stuck = map[string]string{}
	for name, p := range r.procs {
		if err := p.WaitConfirmed(wctx, p.Confirmed()+100); err != nil {
			r.stuck[name] = err.Error()
			r.note("%s did not confirm 100 more after the heal: %v", name, err)
		}
	}
}

// finish stops the workloads, drains their queues and checks each record.
func (r *runner) finish(ctx context.Context) error {
	var errs []error
	for _, mode := range r.o.Modes {
		name := mode.String()
		p := r.procs[name]
		if err := p.Stop(2 * time.Minute); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		ch, done, err := r.admin(ctx)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, q := range r.queue[name] {
			es, err := Drain(ch, q)
			if err != nil {
				errs = append(errs, err)
			}
			p.Add(es...)
		}
		done()
		mr := ModeResult{Mode: mode, Events: p.Events(), Stats: p.ClientStats(), Stuck: r.stuck[name]}
		h, err := ReadHistory(bytes.NewReader(mr.Events), r.t0)
		if err != nil {
			errs = append(errs, err)
		}
		mr.History, mr.Report = h, Check(h, r.res.Ran.For(name))
		r.res.Modes = append(r.res.Modes, mr)
	}
	return errors.Join(errs...)
}

// tearDown kills what still runs and deletes the queues.
func (r *runner) tearDown() {
	for _, p := range r.procs {
		p.Kill()
	}
	if len(r.queue) == 0 {
		return
	}
	ch, done, err := r.admin(context.Background())
	if err != nil {
		return
	}
	defer done()
	for _, qs := range r.queue {
		for _, q := range qs {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	}
}

// Drain fetches every message left in queue, as got events.
func Drain(ch *amqp.Channel, queue string) ([]Event, error) {
	var es []Event
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return es, fmt.Errorf("nemesis: drain %s: %w", queue, err)
		}
		if !ok {
			return es, nil
		}
		es = append(es, Event{Kind: "got", ID: d.MessageId, Client: "drain", T: time.Now().UnixNano()})
	}
}

func sortedByStart(as []Action) []Action {
	out := slices.Clone(as)
	slices.SortStableFunc(out, func(a, b Action) int { return cmp.Compare(a.Start, b.Start) })
	return out
}

// hold keeps a fault for d, or waits until a fault's start: d is part of
// the schedule, not a synchronisation.
func hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
