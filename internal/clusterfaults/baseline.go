package clusterfaults

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	amqp "github.com/rabbitmq/amqp091-go"
)

// baseline is the publisher upstream's documentation leads to, on an
// upstream-mode connection: automatic recovery (Config.Recovery) over the
// cluster's endpoint list, one channel in confirm mode that recovery
// reopens, a window of DeferredConfirmations settled in order, and every
// message not acked published again. After a loss it waits for the
// channel's StateOpen before publishing, as Reconnect's documentation
// asks (reliability/noloss pins why). It has no confirm timeout and does
// not reopen a channel that nacks: that is what is measured.
type baseline struct {
	r      *run
	conn   *amqp.Connection
	ch     *amqp.Channel
	states chan *amqp.StateChanged

	mu    sync.Mutex
	retry []string
	open  bool
}

type pendingConfirm struct {
	id string
	t0 time.Time
	dc *amqp.DeferredConfirmation
}

func startBaseline(ctx context.Context, c *cluster.Cluster, r *run) (*baseline, error) {
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cfg := amqp.Config{
		Heartbeat: r.cfg.Heartbeat,
		Recovery: &amqp.Recovery{ReconnectionConfig: &amqp.ReconnectionConfig{
			MaxRetryCount: 1000,
			RetryInterval: 100 * time.Millisecond,
		}},
	}
	conn, err := compat.DialCluster(dctx, urlsFrom(c, r.f.Publisher), compat.Upstream,
		compat.WithDialer(c.DialContext), compat.WithConfig(cfg))
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	b := &baseline{r: r, conn: conn, ch: ch, states: make(chan *amqp.StateChanged, 1024), open: true}
	ch.NotifyStateChange(b.states)
	return b, nil
}

// follow applies the channel's state changes seen so far.
func (b *baseline) follow() bool {
	for {
		select {
		case e, ok := <-b.states:
			if !ok {
				b.open = false
				return false
			}
			b.open = e.To == amqp.StateOpen
		default:
			return b.open
		}
	}
}

func (b *baseline) next(seq *int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.retry) > 0 {
		id := b.retry[0]
		b.retry = b.retry[1:]
		return id
	}
	*seq++
	return fmt.Sprintf("%s-%07d", b.r.v.Name, *seq)
}

func (b *baseline) again(id string) {
	b.mu.Lock()
	b.retry = append(b.retry, id)
	b.mu.Unlock()
}

// run publishes at the variant's rate until ctx ends, then settles what
// is in flight, each confirm within Bound of its publish.
func (b *baseline) run(ctx context.Context) {
	inflight := make(chan pendingConfirm, 1000)
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		for p := range inflight {
			wctx, cancel := context.WithDeadline(context.Background(), p.t0.Add(b.r.cfg.Bound))
			ok, err := p.dc.WaitContext(wctx)
			cancel()
			switch {
			case ok:
				b.r.b.settle(p.id, p.t0, nil)
			case err != nil:
				b.r.b.settle(p.id, p.t0, context.DeadlineExceeded)
			default: // a nack, or resolved not acked by recovery
				b.r.b.nack()
				b.again(p.id)
			}
		}
	}()
	defer func() { close(inflight); <-settled }()

	tick := time.NewTicker(time.Second / time.Duration(b.r.cfg.Rate))
	defer tick.Stop()
	seq := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !b.follow() {
			continue // recovering: wait for StateOpen
		}
		id := b.next(&seq)
		t0 := time.Now()
		b.r.b.start(id, t0)
		pctx, cancel := context.WithTimeout(ctx, b.r.cfg.Bound)
		dc, err := b.ch.PublishWithDeferredConfirmWithContext(pctx, "", b.r.queue, false, false,
			amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent})
		cancel()
		if err != nil || dc == nil {
			b.again(id)
			continue
		}
		select {
		case inflight <- pendingConfirm{id, t0, dc}:
		case <-ctx.Done():
			b.r.b.settle(id, t0, context.DeadlineExceeded)
			return
		}
	}
}

// close closes the connection, bounded: upstream's Close has no bound of
// its own, and the cell must end.
func (b *baseline) close() {
	done := make(chan struct{})
	go func() { _ = b.conn.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.r.err = fmt.Errorf("upstream Connection.Close still blocked after a minute")
		<-done
	}
}
