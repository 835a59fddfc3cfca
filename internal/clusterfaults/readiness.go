package clusterfaults

import (
	"context"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	amqp "github.com/rabbitmq/amqp091-go"
)

// readiness measures the broker's share of a fault's gap (issue #43): from
// the fault on, every probeEvery, a fresh channel on the fault's Probe
// node, a node the fault spares, publishes one message to each variant's
// queue not yet ready. The first confirm of such a probe is the moment the
// broker could confirm again on a fresh channel; what a client spends
// after it is its own share. Fresh channels, because a channel opened
// during a leader election may never confirm (the nack storm, the silent
// channel), which would charge the broker with the client's time. Each
// queue on its own, because each quorum queue elects its leader on its own
// (the three queues of one cell, with the same leader cut off, were ready
// again up to 0.6 s apart).
//
// The probes carry readinessProbe as their ID, which the books ignore.
type readiness struct {
	conn   *amqp.Connection
	queues []string

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	first map[string]time.Time // each queue's first probe confirm
}

// readinessProbe is the MessageId of the readiness probes.
const readinessProbe = "readiness-probe"

// probeEvery is how often fresh probe channels are opened: the
// resolution of the broker's share.
const probeEvery = 100 * time.Millisecond

// probeWait bounds one probe's wait for its confirm; probes overlap.
const probeWait = 5 * time.Second

// dialReadiness connects to the fault's Probe node, before the fault.
func dialReadiness(ctx context.Context, c *cluster.Cluster, f Fault, queues []string) (*readiness, error) {
	conn, err := dialAdmin(ctx, c, f.Probe)
	if err != nil {
		return nil, err
	}
	return &readiness{conn: conn, queues: queues, first: map[string]time.Time{}}, nil
}

// start probes from now until every queue had a probe confirmed, or stop.
func (r *readiness) start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	r.wg.Go(func() {
		t := time.NewTicker(probeEvery)
		defer t.Stop()
		for {
			for _, q := range r.waiting() {
				r.wg.Go(func() { r.probe(ctx, q) })
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// waiting lists the queues with no probe confirmed yet.
func (r *readiness) waiting() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var qs []string
	for _, q := range r.queues {
		if _, ok := r.first[q]; !ok {
			qs = append(qs, q)
		}
	}
	return qs
}

// probe publishes one message to queue on a fresh channel and records its
// confirm.
func (r *readiness) probe(ctx context.Context, queue string) {
	ch, err := r.conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return
	}
	// Mandatory, and a return voids the probe: the broker acks an
	// unroutable message at once, which would say nothing of the queue.
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	acks := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	msg := amqp.Publishing{MessageId: readinessProbe, Body: []byte(readinessProbe)}
	if err := ch.PublishWithContext(ctx, "", queue, true, false, msg); err != nil {
		return
	}
	t := time.NewTimer(probeWait)
	defer t.Stop()
	select {
	case c := <-acks:
		at := time.Now()
		select {
		case <-returns: // basic.return comes before the ack
			return
		default:
		}
		if c.Ack {
			r.record(queue, at)
		}
	case <-ctx.Done():
	case <-t.C:
	}
}

// record keeps queue's earliest confirm, and ends the probing once every
// queue has one.
func (r *readiness) record(queue string, at time.Time) {
	r.mu.Lock()
	if first, ok := r.first[queue]; !ok || at.Before(first) {
		r.first[queue] = at
	}
	done := len(r.first) == len(r.queues)
	r.mu.Unlock()
	if done {
		r.cancel()
	}
}

// stop ends the probing, closes the connection, and returns each queue's
// first confirm (no entry for a queue that had none). The connection is
// closed before the wait: a probe's channel.close may go unanswered while
// its queue has no leader, and only the connection's end releases it.
func (r *readiness) stop() map[string]time.Time {
	if r.cancel != nil {
		r.cancel()
	}
	_ = r.conn.Close()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first
}
