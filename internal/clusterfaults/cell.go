package clusterfaults

import (
	"context"
	"errors"
	"fmt"
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
	// BrokerReady is how long after the fault a fresh channel on the
	// fault's Probe node first had a publish to the variant's queue
	// confirmed (readiness): the broker's share of the gap; Resume minus
	// it is the client's. BrokerReadyOK says a probe was confirmed before
	// the repair.
	BrokerReady   time.Duration
	BrokerReadyOK bool
	// Timeline is what package failover's publisher did from the fault
	// to the repair (events, the nodes it dialled, acks folded), seconds
	// since the fault; empty for upstream.
	Timeline string
	// Err is a setup or teardown failure of this variant in this cell.
	Err error
}

// ResumeTarget is the target for the time to resume: the confirm
// timeout + 1 s after the publisher's node is cut from its peers or frozen
// (5, 5pm, 8); the broker's own time + 1 s when that node also leads the
// queue (5pmL, 8L: no node confirms before the majority noticed the cut
// or the silence, up to 1.25 × net_ticktime, and elected a new leader,
// about 0.5 s); 1.5 × heartbeat + 1 s after its link is cut (6a); 1 s
// otherwise (a node's death, the nack storm included, or a fault away from
// the publisher). The table also judges the client's share alone, after
// the broker's readiness (ClientShare).
func (c Config) ResumeTarget(f Fault) time.Duration {
	c.defaults()
	switch f.ID {
	case "5+7", "5pm", "8":
		return c.ConfirmTimeout + time.Second
	case "5pmL", "8L", "8o":
		// The bound, with its estimate of the election; the
		// table also judges the client's share alone (ClientShare).
		return c.NetTicktime*5/4 + electionTime + time.Second
	case "6a":
		return c.Heartbeat*3/2 + time.Second
	default:
		return time.Second
	}
}

// ClientShare bounds the client's share of a leader's loss (5pmL, 8L, 8o):
// from the broker's readiness (Result.BrokerReady), or its last nack, to
// the first confirm of a message published after the fault.
// failover.Publisher caps a nack storm's reopen delay, and reopens a
// silent probe, within a quarter of ConfirmTimeout (500 ms here), so its
// share is that delay, a channel.open and a publish's round trip.
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
func dialAdmin(ctx context.Context, c *cluster.Cluster, first cluster.Node) (*amqp.Connection,
	error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return compat.DialCluster(ctx, urlsFrom(c, first), compat.Upstream,
		compat.WithDialer(c.DialContext))
}

// RunCell injects f once while every variant publishes and consumes, and
// returns one Result per variant. Its phases are cell's methods, called in
// this order. A failure to declare the queues ends the cell at once; any
// other failure is recorded in its variant's Result (or, for the
// injection and the repair, in every one) and the cell carries on, so
// that one variant's trouble does not cost the others their measurement
// of a fault that was paid for once.
func RunCell(ctx context.Context, cfg Config, f Fault, round int) []Result {
	cfg.defaults()
	k := newCell(cfg, f, round)
	defer k.deleteQueues()
	if err := k.declare(ctx); err != nil {
		return k.failAll(err)
	}
	k.startWorkload(ctx)
	k.warmUp(ctx)
	k.inject(ctx)
	k.holdFault(ctx)
	k.repair(ctx)
	k.stopPublishing()
	k.drain(ctx)
	return k.judge()
}

// A cell is one RunCell: the variants' runs, the workload's goroutines
// and the times its phases recorded. The phases run one after another on
// RunCell's goroutine, so the cell's own fields need no lock; the runs'
// books, timelines and consumer logs, which the workload's goroutines
// write, have locks of their own.
type cell struct {
	cfg     Config
	c       *cluster.Cluster
	f       Fault
	round   int
	runs    []*run
	results []Result

	// stopPub and stopCons end the publishers' and the consumers'
	// contexts; pubs and cons wait for their goroutines.
	stopPub, stopCons context.CancelFunc
	pubs, cons        sync.WaitGroup
	// closers are the connections Close is timed on (Fault.CloseDuring).
	closers []*stalledConn

	// tInject is when the injection began (the consumer is judged from
	// it), tFault when it returned (the publisher is judged from it),
	// tRepair when the repair began (the end of the gaps measured).
	tInject, tFault, tRepair time.Time
	repairNote               string
	repairErr                error

	// ready probes the broker's readiness on the fault's Probe node
	// (nil if it could not connect); readyAt is each queue's first
	// confirm.
	ready   *readiness
	readyAt map[string]time.Time
}

// newCell sets up one run per variant, each with a queue of its own: the
// variants share the fault, never a queue, so each one's books count only
// its own messages.
func newCell(cfg Config, f Fault, round int) *cell {
	k := &cell{cfg: cfg, c: cfg.Cluster, f: f, round: round}
	k.results = make([]Result, len(cfg.Variants))
	k.runs = make([]*run, len(cfg.Variants))
	for i, v := range cfg.Variants {
		k.results[i] = Result{Fault: f, Variant: v, Round: round}
		k.runs[i] = &run{cfg: &k.cfg, v: v, f: f, b: newBook(), queue: queueName(f, round, v)}
	}
	return k
}

// queueName names a variant's queue in one cell. The time suffix makes it
// unlikely that a queue an earlier run failed to delete (deleteQueue is
// best effort) is reused, with its messages, by this one.
func queueName(f Fault, round int, v Variant) string {
	return fmt.Sprintf("clusterfaults-%s-r%d-%s-%d", strings.ReplaceAll(f.ID, "+", ""), round,
		v.Name, time.Now().UnixNano()%1e6)
}

// logf narrates the cell, each line prefixed with the fault and round.
func (k *cell) logf(format string, args ...any) {
	k.cfg.Logf("[fault %s round %d] "+format, append([]any{k.f.ID, k.round}, args...)...)
}

// deleteQueues removes every variant's queue, whatever phase the cell
// ended in: quorum queues left behind would keep their messages (and
// their Raft members) on the cluster for the next cells.
func (k *cell) deleteQueues() {
	for _, r := range k.runs {
		r.deleteQueue(k.c)
	}
}

// declare declares the queues from the fault's Leader node, which places
// their leader there (each fault says where it wants it), and records the
// leader the cluster reports, so that a table shows where it really was.
func (k *cell) declare(ctx context.Context) error {
	if err := declareQueues(ctx, k.c, k.f.Leader, k.runs); err != nil {
		return err
	}
	if l, err := k.c.Leader(ctx, k.runs[0].queue); err == nil {
		for i := range k.results {
			k.results[i].Leader = string(l)
		}
	}
	return nil
}

// failAll ends a cell that could not be set up: every variant's Result
// carries err, and nothing was measured.
func (k *cell) failAll(err error) []Result {
	for i := range k.results {
		k.results[i].Err = err
	}
	return k.results
}

// startWorkload starts every variant's consumer and publisher, and, for a
// fault that times Close, the stalled connections. A publisher that
// cannot start fails its variant (run.err) but not the cell.
func (k *cell) startWorkload(ctx context.Context) {
	pubCtx, stopPub := context.WithCancel(ctx)
	consCtx, stopCons := context.WithCancel(ctx)
	k.stopPub = stopPub
	k.stopCons = stopCons
	for _, r := range k.runs {
		k.cons.Go(func() { r.consume(consCtx, k.c) })
	}
	for _, r := range k.runs {
		if err := r.startPublisher(ctx, k.c); err != nil {
			r.err = err
			continue
		}
		k.pubs.Go(func() { r.publish(pubCtx) })
	}
	if k.f.CloseDuring {
		k.openClosers(ctx)
	}
	var queues []string
	for _, r := range k.runs {
		queues = append(queues, r.queue)
	}
	ready, err := dialReadiness(ctx, k.c, k.f, queues)
	if err != nil {
		k.logf("readiness probe: %v (the broker's share goes unmeasured)", err)
		return
	}
	k.ready = ready
}

// openClosers opens, for every variant whose publisher started, a
// connection to the publisher's node whose Close the fault will stall
// (the fault 7). A connection that cannot open fails its variant.
func (k *cell) openClosers(ctx context.Context) {
	for _, r := range k.runs {
		if r.err != nil {
			continue
		}
		sc, err := openStalled(ctx, k.c, r)
		if err != nil {
			r.err = fmt.Errorf("connection for Close: %w", err)
			continue
		}
		k.closers = append(k.closers, sc)
	}
}

// warmUp waits until every running variant has confirmed a second's worth
// of messages, so that the fault meets publishers in their steady state
// and a gap measures the fault, not a slow start. Past 30 s the cell goes
// on, and says so.
func (k *cell) warmUp(ctx context.Context) {
	warm := WaitFor(ctx, 30*time.Second, func() bool {
		for _, r := range k.runs {
			if r.err == nil && r.b.confirmedCount() < k.cfg.Rate {
				return false
			}
		}
		return true
	})
	if !warm {
		k.logf("warm-up: not every variant confirmed %d messages within 30 s", k.cfg.Rate)
	}
}

// inject does the fault and marks it on every timeline, then sets the
// timed Closes going. A failed injection fails every variant: what they
// did was not under the fault.
func (k *cell) inject(ctx context.Context) {
	k.logf("inject: %s", k.f.Name)
	// A kill returns once the node's process is gone, which may be after
	// the consumer noticed and consumed elsewhere: the consumer is
	// judged from the start of the injection.
	k.tInject = time.Now()
	if err := k.f.Inject(ctx, k.c); err != nil {
		for _, r := range k.runs {
			r.err = errors.Join(r.err, fmt.Errorf("inject: %w", err))
		}
	}
	k.tFault = time.Now()
	if k.ready != nil {
		k.ready.start(ctx)
	}
	for _, r := range k.runs {
		r.tl.add(k.tFault, "fault")
	}
	for _, sc := range k.closers {
		sc.closeAfter(stallProof(k.cfg))
	}
}

// holdFault waits until every running variant resumed, or the window
// ends; then it keeps a cut for the rest of its Hold, or, once the Hold
// is over (a kill has none), lets the workload run 2 s more, so that the
// longest gap and the books cover some time after the resume too.
func (k *cell) holdFault(ctx context.Context) {
	WaitFor(ctx, k.cfg.Window, func() bool {
		for _, r := range k.runs {
			if _, ok := r.b.resumedAfter(k.tFault); r.err == nil && !ok {
				return false
			}
		}
		return true
	})
	rest := k.f.Hold - time.Since(k.tFault)
	if rest <= 0 {
		rest = 2 * time.Second
	}
	pause(ctx, rest)
}

// repair undoes the fault, marking it on every timeline. The repair is
// bounded (5 minutes: a node's VM may need killing and booting again);
// its note and error go into every Result.
func (k *cell) repair(ctx context.Context) {
	k.tRepair = time.Now()
	if k.ready != nil {
		k.readyAt = k.ready.stop()
	}
	for _, r := range k.runs {
		r.tl.add(k.tRepair, "repair")
	}
	k.logf("repair")
	repairCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	k.repairNote, k.repairErr = k.f.Repair(repairCtx, k.c)
	cancel()
	if k.repairErr != nil {
		k.logf("repair: %v", k.repairErr)
	}
	if k.repairNote != "" {
		k.logf("repair: %s", k.repairNote)
	}
}

// stopPublishing ends the publishers and waits for them: every publish
// call ends within its bound, so this is bounded too. Then it closes the
// publishers and waits for the timed Closes, whose times the judge reads.
func (k *cell) stopPublishing() {
	k.stopPub()
	k.pubs.Wait()
	for _, r := range k.runs {
		r.closePublisher()
	}
	for _, sc := range k.closers {
		sc.wait()
	}
}

// drain lets the consumers catch up with the queues (for up to 60 s), stops
// them, and fetches what is left, so that a confirmed message counts as
// lost only if the queue no longer holds it.
func (k *cell) drain(ctx context.Context) {
	WaitFor(ctx, 60*time.Second, func() bool {
		for _, r := range k.runs {
			if n, err := r.depth(ctx, k.c); err != nil || n > 0 {
				return false
			}
		}
		return true
	})
	k.stopCons()
	k.cons.Wait()
	for _, r := range k.runs {
		if err := r.fetchRest(ctx, k.c); err != nil {
			r.err = errors.Join(r.err, fmt.Errorf("fetching what is left: %w", err))
		}
	}
}

// judge turns the books into the Results, once every goroutine of the
// cell has ended: each variant's measurements, the time its timed Close
// took, and what the repair found.
func (k *cell) judge() []Result {
	for i, r := range k.runs {
		k.measure(r, &k.results[i])
	}
	for _, sc := range k.closers {
		for i := range k.results {
			if k.results[i].Variant.Name == sc.r.v.Name {
				k.results[i].Close = sc.took
				k.results[i].CloseErr = sc.errText
			}
		}
	}
	for i := range k.results {
		k.results[i].RepairNote = k.repairNote
		if k.repairErr != nil {
			k.results[i].Err = errors.Join(k.results[i].Err, fmt.Errorf("repair: %w", k.repairErr))
		}
	}
	return k.results
}

// measure fills res from r's books: the publisher's resume and gaps from
// the fault, the ledger, the publisher's counters and timeline (package
// failover's only: the baseline keeps none), and the consumer's resume
// from the injection.
func (k *cell) measure(r *run, res *Result) {
	res.Resume, res.Resumed = r.b.resumedAfter(k.tFault)
	if at, ok := k.readyAt[r.queue]; ok {
		res.BrokerReady, res.BrokerReadyOK = at.Sub(k.tFault), true
	}
	res.MaxGap = r.b.maxGap(k.tFault, k.tRepair)
	if res.Resumed && r.fp != nil {
		resumed := k.tFault.Add(res.Resume)
		res.AfterNack, res.NackedFirst = r.tl.sinceLast("nack", k.tFault, resumed)
	}
	r.b.account(res)
	res.Nacks, res.Failovers, res.Reopens, res.Abandons = r.counters()
	if r.fp != nil {
		res.Timeline = r.tl.since(k.tFault, k.tRepair)
	}
	res.ConsumerResume, res.ConsumerReconnects, res.ConsumerResumed = r.cl.resumedAfter(k.tInject)
	res.Err = errors.Join(res.Err, r.err)
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
		_, err := ch.QueueDeclare(r.queue, true, false, false, false,
			amqp.Table{"x-queue-type": "quorum"})
		if err != nil {
			return fmt.Errorf("declaring %s: %w", r.queue, err)
		}
	}
	return nil
}
