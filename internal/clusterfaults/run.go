package clusterfaults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/failover"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	amqp "github.com/rabbitmq/amqp091-go"
)

// run is one variant in one cell.
type run struct {
	cfg   *Config
	v     Variant
	f     Fault
	b     *book
	queue string
	err   error

	fp   *failover.Publisher // drainer and legacy
	base *baseline           // upstream
	tl   timeline            // failover's events, landings and acks
	cl   consumerLog         // when the consumer consumed, and got deliveries
}

// consumerLog keeps the times the consumer started consuming (each
// basic.consume-ok) and handled deliveries, to tell whether it consumed
// again after a fault took its node away.
type consumerLog struct {
	mu        sync.Mutex
	consuming []time.Time
	delivered []time.Time
}

func (l *consumerLog) event(e failover.Event) {
	if e.Kind != failover.EventConsuming {
		return
	}
	l.mu.Lock()
	l.consuming = append(l.consuming, e.Time)
	l.mu.Unlock()
}

func (l *consumerLog) delivery(at time.Time) {
	l.mu.Lock()
	l.delivered = append(l.delivered, at)
	l.mu.Unlock()
}

// resumedAfter returns the time from t to the first delivery handled
// after the first basic.consume that followed t, and how many times the
// consumer consumed after t; ok is false if no such delivery was handled.
func (l *consumerLog) resumedAfter(t time.Time) (d time.Duration, reconsumes int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for _, c := range l.consuming {
		if c.After(t) {
			if first.IsZero() {
				first = c
			}
			reconsumes++
		}
	}
	if first.IsZero() {
		return 0, 0, false
	}
	for _, at := range l.delivered {
		if at.After(first) {
			return at.Sub(t), reconsumes, true
		}
	}
	return 0, reconsumes, false
}

// options are the read path's options of the variant's connections:
// drainer and legacy bound Close by CloseTimeout.
func (r *run) options() []compat.Option {
	switch r.v.Mode {
	case compat.Drainer:
		o := amqp.DrainerOptions{CloseTimeout: r.cfg.CloseTimeout}
		return []compat.Option{compat.WithDrainerOptions(o)}
	case compat.Legacy, compat.LegacyAutoDrain:
		o := amqp.LegacyOptions{CloseTimeout: r.cfg.CloseTimeout}
		return []compat.Option{compat.WithLegacyOptions(o)}
	}
	return nil
}

// rotor dials the cluster round robin across calls: each dial starts at
// the node after the one the previous connection landed on, so a client
// that abandons a node (a confirm timeout) tries the others first.
type rotor struct {
	c    *cluster.Cluster
	r    *run
	cfg  amqp.Config
	mu   sync.Mutex
	next cluster.Node
	pub  bool // the publisher's: landings go on the timeline
}

func (r *run) rotor(c *cluster.Cluster, first cluster.Node, cfg amqp.Config) *rotor {
	return &rotor{c: c, r: r, cfg: cfg, next: first}
}

func (ro *rotor) dial(ctx context.Context) (*amqp.Connection, error) {
	ro.mu.Lock()
	first := ro.next
	ro.mu.Unlock()
	opts := append([]compat.Option{compat.WithDialer(ro.c.DialContext), compat.WithConfig(ro.cfg)},
		ro.r.options()...)
	conn, err := compat.DialCluster(ctx, urlsFrom(ro.c, first), ro.r.v.Mode, opts...)
	if err != nil {
		return nil, err
	}
	landed := nodeOf(ro.c, conn.RemoteAddr())
	if ro.pub {
		ro.r.tl.add(time.Now(), "dialled "+string(landed))
	}
	ro.mu.Lock()
	for i, n := range cluster.Nodes {
		if n == landed {
			ro.next = cluster.Nodes[(i+1)%len(cluster.Nodes)]
		}
	}
	ro.mu.Unlock()
	return conn, nil
}

// nodeOf names the node at addr, or "" if none.
func nodeOf(c *cluster.Cluster, addr net.Addr) cluster.Node {
	if addr == nil {
		return ""
	}
	for _, n := range cluster.Nodes {
		u, err := amqp.ParseURI(c.URL(n))
		if err == nil && net.JoinHostPort(u.Host, fmt.Sprint(u.Port)) == addr.String() {
			return n
		}
	}
	return ""
}

func (r *run) consume(ctx context.Context, c *cluster.Cluster) {
	ro := r.rotor(c, r.f.Consumer, amqp.Config{Heartbeat: r.cfg.Heartbeat})
	err := failover.Consume(ctx, failover.ConsumerOptions{
		Dial:     ro.dial,
		Queue:    r.queue,
		Prefetch: 500,
		OnEvent:  r.cl.event,
	}, func(_ context.Context, d amqp.Delivery) error {
		r.cl.delivery(time.Now())
		r.b.consumed(d.MessageId, d.Redelivered)
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		r.err = errors.Join(r.err, fmt.Errorf("consumer: %w", err))
	}
}

func (r *run) startPublisher(ctx context.Context, c *cluster.Cluster) error {
	if r.v.Baseline {
		b, err := startBaseline(ctx, c, r)
		r.base = b
		return err
	}
	ro := r.rotor(c, r.f.Publisher, amqp.Config{Heartbeat: r.cfg.Heartbeat})
	ro.pub = true
	p, err := failover.NewPublisher(ctx, failover.PublisherOptions{
		Dial:           ro.dial,
		MaxOutstanding: 1000,
		ConfirmTimeout: r.cfg.ConfirmTimeout,
		CloseTimeout:   r.cfg.CloseTimeout,
		OnEvent:        r.tl.event,
	})
	r.fp = p
	return err
}

// publish issues Rate messages a second until ctx ends, each in its own
// call bounded by Bound, and returns once every call has returned.
func (r *run) publish(ctx context.Context) {
	if r.base != nil {
		r.base.run(ctx)
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Second / time.Duration(r.cfg.Rate))
	defer tick.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		id := fmt.Sprintf("%s-%07d", r.v.Name, seq)
		t0 := time.Now()
		r.b.start(id, t0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(context.Background(), r.cfg.Bound)
			defer cancel()
			err := r.fp.Publish(pctx, "", r.queue, false, amqp.Publishing{
				MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent,
			})
			r.b.settle(id, t0, err)
			if err == nil && r.fp != nil {
				r.tl.add(time.Now(), "ack")
			}
		}()
	}
}

func (r *run) closePublisher() {
	switch {
	case r.fp != nil:
		_ = r.fp.Close()
	case r.base != nil:
		r.base.close()
	}
}

// counters returns nacks, failovers, channel reopens and abandons.
func (r *run) counters() (nacks, failovers, reopens, abandons int) {
	if r.fp != nil {
		s := r.fp.Stats()
		return int(s.Nacks), int(s.Failovers), int(s.ChannelReopens), int(s.Abandons)
	}
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	return r.b.nacks, 0, 0, 0
}

// depth is the number of ready messages in the queue.
func (r *run) depth(ctx context.Context, c *cluster.Cluster) (int, error) {
	conn, err := dialAdmin(ctx, c, r.f.Consumer)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(r.queue, true, false, false, false,
		amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// fetchRest takes whatever is still in the queue into the books.
func (r *run) fetchRest(ctx context.Context, c *cluster.Cluster) error {
	conn, err := dialAdmin(ctx, c, r.f.Consumer)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for {
		d, ok, err := ch.Get(r.queue, true)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		r.b.consumed(d.MessageId, d.Redelivered)
	}
}

func (r *run) deleteQueue(c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := dialAdmin(ctx, c, cluster.A)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(r.queue, false, false, false)
	}
}

// closeProbe is the ID of the message whose confirm stalls before Close.
const closeProbe = "close-probe"

// stalledConn is a connection to the publisher's node with a confirm
// outstanding when the fault cuts the node off: Close is timed on it.
type stalledConn struct {
	r       *run
	conn    *amqp.Connection
	ch      *amqp.Channel
	stop    context.CancelFunc
	drained chan struct{}
	done    chan struct{}
	took    time.Duration
	errText string
}

func openStalled(ctx context.Context, c *cluster.Cluster, r *run) (*stalledConn, error) {
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	opts := append([]compat.Option{
		compat.WithDialer(c.DialContext),
		compat.WithConfig(amqp.Config{Heartbeat: r.cfg.Heartbeat}),
	}, r.options()...)
	conn, err := compat.DialCluster(dctx, []string{c.URL(r.f.Publisher)}, r.v.Mode, opts...)
	if err != nil {
		return nil, err
	}
	sc := &stalledConn{r: r, conn: conn, drained: make(chan struct{}), done: make(chan struct{})}
	var dctx2 context.Context
	dctx2, sc.stop = context.WithCancel(context.Background())
	go func() {
		// Legacy mode reads only while someone drains: a drain loop, as
		// a legacy application runs one.
		defer close(sc.drained)
		if conn.ReadMode() != "legacy" {
			return
		}
		for conn.DrainEvents(dctx2) == nil {
		}
	}()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		sc.stop()
		_ = conn.Close()
		<-sc.drained
		return nil, err
	}
	sc.ch = ch
	return sc, nil
}

// closeAfter publishes one message now (its confirm stalls behind the
// fault), and calls Close after d, in the background.
func (sc *stalledConn) closeAfter(d time.Duration) {
	go func() {
		defer close(sc.done)
		_, _ = sc.ch.PublishWithDeferredConfirmWithContext(context.Background(), "", sc.r.queue,
			false, false, amqp.Publishing{MessageId: closeProbe, Body: []byte(closeProbe)})
		pause(context.Background(), d)
		t0 := time.Now()
		err := sc.conn.Close()
		sc.took = time.Since(t0)
		if err != nil {
			sc.errText = err.Error()
		}
	}()
}

// wait waits for the timed Close (upstream's waits for the heal), then
// ends the drain loop.
func (sc *stalledConn) wait() {
	select {
	case <-sc.done:
	case <-time.After(5 * time.Minute):
		sc.errText = "Close still blocked after 5 minutes"
	}
	sc.stop()
	<-sc.drained
}
