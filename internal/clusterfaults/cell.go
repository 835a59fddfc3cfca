package clusterfaults

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A Variant is one way a client runs in every cell.
type Variant struct {
	// Name is "upstream", "drainer" or "legacy".
	Name string
	// Mode is the read mode of all its connections.
	Mode compat.Mode
	// Baseline marks upstream mode: its publisher is the one upstream's
	// documentation suggests (automatic recovery, wait for the channel's
	// StateOpen, republish what was not acked), not package failover. It
	// is measured and reported, never judged.
	Baseline bool
}

// Variants are the three the issue asks for. Legacy runs a drain loop
// (package failover runs one for legacy connections).
var Variants = []Variant{
	{Name: "upstream", Mode: compat.Upstream, Baseline: true},
	{Name: "drainer", Mode: compat.Drainer},
	{Name: "legacy", Mode: compat.Legacy},
}

// Config sets up the cells.
type Config struct {
	Cluster  *cluster.Cluster
	Variants []Variant
	// Rate is each variant's publishes per second (default 100).
	Rate int
	// Heartbeat of every connection (default 2 s).
	Heartbeat time.Duration
	// ConfirmTimeout of the failover publishers (default 2 s).
	ConfirmTimeout time.Duration
	// CloseTimeout of drainer and legacy connections and publishers
	// (default 2 s).
	CloseTimeout time.Duration
	// NetTicktime is the cluster's net_ticktime (default 60 s,
	// RabbitMQ's): the nodes notice a cut after 0.75–1.25 times it, which
	// sets the target of a cut of the leader's node (5pmL).
	NetTicktime time.Duration
	// Window bounds the wait for every variant to resume after a fault
	// (default 30 s).
	Window time.Duration
	// Bound is each publish call's own deadline (default 30 s).
	Bound time.Duration
	// Logf, if set, narrates the cell.
	Logf func(format string, args ...any)
}

func (c *Config) defaults() {
	if c.Rate == 0 {
		c.Rate = 100
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 2 * time.Second
	}
	if c.ConfirmTimeout == 0 {
		c.ConfirmTimeout = 2 * time.Second
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 2 * time.Second
	}
	if c.NetTicktime == 0 {
		c.NetTicktime = 60 * time.Second
	}
	if c.Window == 0 {
		c.Window = 30 * time.Second
	}
	if c.Bound == 0 {
		c.Bound = 30 * time.Second
	}
	if len(c.Variants) == 0 {
		c.Variants = Variants
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// Result is one variant's outcome in one cell.
type Result struct {
	Fault   Fault
	Variant Variant
	Round   int
	// Leader is the queue's leader found before the fault.
	Leader string
	// Resumed says a message first published after the fault was
	// confirmed; Resume is how long after the fault the first was.
	Resumed bool
	Resume  time.Duration
	// MaxGap is the longest time without any confirm, from the fault to
	// the repair.
	MaxGap time.Duration
	// AfterNack is how long after the broker's last nack before Resume
	// the publisher resumed; NackedFirst says there was such a nack
	// (package failover's publisher only). The broker refuses until its
	// leader election ends, so what follows its last nack is the
	// client's share of the gap.
	AfterNack   time.Duration
	NackedFirst bool
	// Published and Confirmed count distinct IDs.
	Published, Confirmed int
	// Nacks, Failovers, Reopens and Abandons come from the publisher.
	Nacks, Failovers, Reopens, Abandons int
	// Duplicates are extra deliveries of an ID; Redelivered counts
	// deliveries flagged redelivered.
	Duplicates, Redelivered int
	// Lost are IDs confirmed but neither consumed nor left in the queue;
	// Phantoms were found but never published.
	Lost, Phantoms int
	LostIDs        []string
	// Unsettled publishes ended at their bound; Failed with another
	// error; Longest is the longest publish call.
	Unsettled, Failed int
	Errors            []string
	Longest           time.Duration
	// Close is how long Connection.Close took during the fault
	// (Fault.CloseDuring); CloseErr is what it returned.
	Close    time.Duration
	CloseErr string
	// RepairNote is what the repair found (a partition still recorded).
	RepairNote string
	// ConsumerResumed says the consumer handled a delivery on a
	// connection it set up after the fault's injection began (it
	// consumed again); ConsumerResume is how long after that the first
	// was, and ConsumerReconnects how many times it consumed again
	// (basic.consume since). The consumer is package failover's in every
	// variant, upstream's included.
	ConsumerResumed    bool
	ConsumerResume     time.Duration
	ConsumerReconnects int
	// Timeline is what package failover's publisher did from the fault
	// to the repair (events, the nodes it dialled, acks folded), seconds
	// since the fault; empty for upstream.
	Timeline string
	// Err is a setup or teardown failure of this variant in this cell.
	Err error
}

// ResumeTarget is the target for the time to resume: the confirm
// timeout + 1 s after the publisher's node is cut from its peers (5, 5pm);
// the broker's own time + 1 s when that node also leads the queue (5pmL:
// no node confirms before the majority noticed the cut, up to 1.25 ×
// net_ticktime, and elected a new leader, about 0.5 s); 1.5 × heartbeat +
// 1 s after its link is cut (6a); 1 s otherwise (a node's death, the nack
// storm included, or a fault away from the publisher).
func (c Config) ResumeTarget(f Fault) time.Duration {
	c.defaults()
	switch f.ID {
	case "5+7", "5pm":
		return c.ConfirmTimeout + time.Second
	case "5pmL":
		// The bound, with its estimate of the election; the
		// table also judges the client's share alone (ClientShare).
		return c.NetTicktime*5/4 + electionTime + time.Second
	case "6a":
		return c.Heartbeat*3/2 + time.Second
	default:
		return time.Second
	}
}

// ClientShare bounds the client's share of fault 5pmL's gap: from the
// broker's last nack (its election still running) to the first confirm
// of a message published after the fault. failover.Publisher caps a nack
// storm's reopen delay at a quarter of ConfirmTimeout (500 ms here), so
// its share is that delay, a channel.open and a publish's round trip.
const ClientShare = time.Second

// electionTime is how long a quorum queue's new leader takes to be
// elected once its members saw the old one go (measured under half a
// second after a kill -9, fault 2).
const electionTime = 500 * time.Millisecond

// urlsFrom lists the cluster's URLs starting at node first.
func urlsFrom(c *cluster.Cluster, first cluster.Node) []string {
	all := c.URLs()
	i := 0
	for k, n := range cluster.Nodes {
		if n == first {
			i = k
		}
	}
	return append(append([]string(nil), all[i:]...), all[:i]...)
}

// dialAdmin opens an upstream-mode connection to the first running node
// from first on, for declaring, counting and fetching.
func dialAdmin(ctx context.Context, c *cluster.Cluster, first cluster.Node) (*amqp.Connection, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return compat.DialCluster(ctx, urlsFrom(c, first), compat.Upstream, compat.WithDialer(c.DialContext))
}

// RunCell injects f once while every variant publishes and consumes, and
// returns one Result per variant.
func RunCell(ctx context.Context, cfg Config, f Fault, round int) []Result {
	cfg.defaults()
	c := cfg.Cluster
	logf := func(format string, args ...any) {
		cfg.Logf("[fault %s round %d] "+format, append([]any{f.ID, round}, args...)...)
	}
	results := make([]Result, len(cfg.Variants))
	runs := make([]*run, len(cfg.Variants))
	for i, v := range cfg.Variants {
		results[i] = Result{Fault: f, Variant: v, Round: round}
		runs[i] = &run{cfg: &cfg, v: v, f: f, b: newBook(),
			queue: fmt.Sprintf("clusterfaults-%s-r%d-%s-%d", strings.ReplaceAll(f.ID, "+", ""), round, v.Name, time.Now().UnixNano()%1e6)}
	}
	defer func() {
		for _, r := range runs {
			r.deleteQueue(c)
		}
	}()

	// Queues: declared from the leader's node, which places their leader
	// there.
	if err := declareQueues(ctx, c, f.Leader, runs); err != nil {
		for i := range results {
			results[i].Err = err
		}
		return results
	}
	if l, err := c.Leader(ctx, runs[0].queue); err == nil {
		for i := range results {
			results[i].Leader = string(l)
		}
	}

	// Consumers, publishers, and the stalled connections Close is timed on.
	pubCtx, stopPub := context.WithCancel(ctx)
	consCtx, stopCons := context.WithCancel(ctx)
	var pubs, cons sync.WaitGroup
	for _, r := range runs {
		cons.Add(1)
		go func() { defer cons.Done(); r.consume(consCtx, c) }()
	}
	for _, r := range runs {
		if err := r.startPublisher(ctx, c); err != nil {
			r.err = err
			continue
		}
		pubs.Add(1)
		go func() { defer pubs.Done(); r.publish(pubCtx) }()
	}
	var closers []*stalledConn
	if f.CloseDuring {
		for _, r := range runs {
			if r.err != nil {
				continue
			}
			sc, err := openStalled(ctx, c, r)
			if err != nil {
				r.err = fmt.Errorf("connection for Close: %w", err)
				continue
			}
			closers = append(closers, sc)
		}
	}

	// Warm up: every variant confirms a second's worth before the fault.
	warm := WaitFor(ctx, 30*time.Second, func() bool {
		for _, r := range runs {
			if r.err == nil && r.b.confirmedCount() < cfg.Rate {
				return false
			}
		}
		return true
	})
	if !warm {
		logf("warm-up: not every variant confirmed %d messages within 30 s", cfg.Rate)
	}

	logf("inject: %s", f.Name)
	// A kill returns once the node's process is gone, which may be after
	// the consumer noticed and consumed elsewhere: the consumer is
	// judged from the start of the injection.
	tInject := time.Now()
	if err := f.Inject(ctx, c); err != nil {
		for _, r := range runs {
			r.err = errors.Join(r.err, fmt.Errorf("inject: %w", err))
		}
	}
	tFault := time.Now()
	for _, r := range runs {
		r.tl.add(tFault, "fault")
	}
	for _, sc := range closers {
		sc.closeAfter(stallProof(cfg))
	}

	// Wait until every variant resumed, or the window ends; then hold a
	// cut for its time, or keep publishing a little after a kill.
	WaitFor(ctx, cfg.Window, func() bool {
		for _, r := range runs {
			if _, ok := r.b.resumedAfter(tFault); r.err == nil && !ok {
				return false
			}
		}
		return true
	})
	if rest := f.Hold - time.Since(tFault); rest > 0 {
		pause(ctx, rest)
	} else {
		pause(ctx, 2*time.Second)
	}
	tRepair := time.Now()
	for _, r := range runs {
		r.tl.add(tRepair, "repair")
	}
	logf("repair")
	repairCtx, cancelRepair := context.WithTimeout(ctx, 5*time.Minute)
	repairNote, repairErr := f.Repair(repairCtx, c)
	cancelRepair()
	if repairErr != nil {
		logf("repair: %v", repairErr)
	}
	if repairNote != "" {
		logf("repair: %s", repairNote)
	}

	// Stop publishing; every publish call ends within its bound.
	stopPub()
	pubs.Wait()
	for _, r := range runs {
		r.closePublisher()
	}
	for _, sc := range closers {
		sc.wait()
	}

	// Let the consumers catch up with the queues, then fetch what is left.
	WaitFor(ctx, 60*time.Second, func() bool {
		for _, r := range runs {
			if n, err := r.depth(ctx, c); err != nil || n > 0 {
				return false
			}
		}
		return true
	})
	stopCons()
	cons.Wait()
	for _, r := range runs {
		if err := r.fetchRest(ctx, c); err != nil {
			r.err = errors.Join(r.err, fmt.Errorf("fetching what is left: %w", err))
		}
	}

	for i, r := range runs {
		res := &results[i]
		res.Resume, res.Resumed = r.b.resumedAfter(tFault)
		res.MaxGap = r.b.maxGap(tFault, tRepair)
		if res.Resumed && r.fp != nil {
			resumed := tFault.Add(res.Resume)
			if at, ok := r.tl.lastBefore("nack", tFault, resumed); ok {
				res.AfterNack, res.NackedFirst = resumed.Sub(at), true
			}
		}
		res.Published, res.Confirmed = len(r.b.started), r.b.confirmedCount()
		res.Lost, res.Duplicates, res.Phantoms, res.LostIDs = r.b.audit()
		res.Redelivered = r.b.redeliv
		res.Unsettled, res.Failed, res.Longest = r.b.unsettled, r.b.failed, r.b.longest
		for e, n := range r.b.errs {
			res.Errors = append(res.Errors, fmt.Sprintf("%dx %s", n, e))
		}
		sort.Strings(res.Errors)
		res.Nacks, res.Failovers, res.Reopens, res.Abandons = r.counters()
		if r.fp != nil {
			res.Timeline = r.tl.since(tFault, tRepair)
		}
		res.ConsumerResume, res.ConsumerReconnects, res.ConsumerResumed = r.cl.resumedAfter(tInject)
		res.Err = errors.Join(res.Err, r.err)
	}
	for _, sc := range closers {
		for i := range results {
			if results[i].Variant.Name == sc.r.v.Name {
				results[i].Close, results[i].CloseErr = sc.took, sc.errText
			}
		}
	}
	for i := range results {
		results[i].RepairNote = repairNote
	}
	if repairErr != nil {
		for i := range results {
			results[i].Err = errors.Join(results[i].Err, fmt.Errorf("repair: %w", repairErr))
		}
	}
	return results
}

// stallProof is how long after the fault Close is called on the stalled
// connections: long enough that the cut is in place and the confirm is
// certainly stalled, short against the hold.
func stallProof(cfg Config) time.Duration { return cfg.ConfirmTimeout }

// WaitFor polls cond until it holds or d passes (or ctx ends); it reports
// whether it held. Polling, not sleeping: the condition is the
// synchronisation.
func WaitFor(ctx context.Context, d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// pause lets the workload run for d: the length of a fault is the
// experiment, not a synchronisation.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func declareQueues(ctx context.Context, c *cluster.Cluster, on cluster.Node, runs []*run) error {
	conn, err := dialAdmin(ctx, c, on)
	if err != nil {
		return fmt.Errorf("declaring on %s: %w", on, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, r := range runs {
		if _, err := ch.QueueDeclare(r.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return fmt.Errorf("declaring %s: %w", r.queue, err)
		}
	}
	return nil
}
