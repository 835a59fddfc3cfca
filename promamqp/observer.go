package promamqp

import (
	"context"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/prometheus/client_golang/prometheus"
)

// rpcMethods are the label values of amqp091_rpc_seconds and
// amqp091_rpc_errors_total: every method of AMQP 0-9-1, so that whatever
// name RPCInfo.Method carries (the request's, as "queue.declare", or for
// the handshake's waits the server's, as "connection.tune") has its
// histogram ready, and any other string falls into otherMethod.
// A fixed set keeps the label's cardinality bounded whatever a broker
// sends, and lets the hot path find its histogram with one lookup in a
// map that is never written after New.
var rpcMethods = []string{
	"protocol header", // the handshake's first wait, for connection.start
	"basic.ack", "basic.cancel", "basic.cancel-ok", "basic.consume", "basic.consume-ok",
	"basic.deliver", "basic.get", "basic.get-empty", "basic.get-ok", "basic.nack",
	"basic.publish", "basic.qos", "basic.qos-ok", "basic.recover", "basic.recover-async",
	"basic.recover-ok", "basic.reject", "basic.return",
	"channel.close", "channel.close-ok", "channel.flow", "channel.flow-ok", "channel.open",
	"channel.open-ok",
	"confirm.select", "confirm.select-ok",
	"connection.blocked", "connection.close", "connection.close-ok", "connection.open",
	"connection.open-ok", "connection.secure", "connection.secure-ok", "connection.start",
	"connection.start-ok", "connection.tune", "connection.tune-ok", "connection.unblocked",
	"connection.update-secret", "connection.update-secret-ok",
	"exchange.bind", "exchange.bind-ok", "exchange.declare", "exchange.declare-ok",
	"exchange.delete", "exchange.delete-ok", "exchange.unbind", "exchange.unbind-ok",
	"queue.bind", "queue.bind-ok", "queue.declare", "queue.declare-ok", "queue.delete",
	"queue.delete-ok", "queue.purge", "queue.purge-ok", "queue.unbind", "queue.unbind-ok",
	"tx.commit", "tx.commit-ok", "tx.rollback", "tx.rollback-ok", "tx.select", "tx.select-ok",
}

// otherMethod labels the RPCs whose RPCInfo.Method is not an AMQP 0-9-1
// method name: the client's own "request" for a wait it cannot name, or a
// name a newer client adds.
const otherMethod = "other"

// The label values of the enums, indexed by the enum; index 0 collects
// values this package does not know (a newer amqp091-go's), so that a new
// kind is still counted rather than lost.
const (
	settleKinds = int(amqp.SettleReject) + 1
	connKinds   = int(amqp.ConnectionFailed) + 1
)

type rpcMetrics struct {
	method  string
	latency *histogram
	errors  atomic.Uint64
}

// counters are what the Observer's funcs add to: plain atomics and
// lock-free histograms, so that no event allocates or takes a lock.
type counters struct {
	published, publishErrors    atomic.Uint64
	confirmedAck, confirmedNack atomic.Uint64
	returned, delivered         atomic.Uint64
	handlerErrors               atomic.Uint64
	settled                     [settleKinds]atomic.Uint64
	budgetPauses                atomic.Uint64
	listenersDropped            atomic.Uint64
	connEvents                  [connKinds]atomic.Uint64

	confirmLatency, handler, budgetPause *histogram

	rpc      map[string]*rpcMetrics // read-only after init
	rpcOther *rpcMetrics
	rpcAll   []*rpcMetrics // rpc's values and rpcOther, in a stable order for Collect
}

func (n *counters) init(b *buckets) {
	n.confirmLatency = newHistogram(b)
	n.handler = newHistogram(b)
	n.budgetPause = newHistogram(b)
	n.rpc = make(map[string]*rpcMetrics, len(rpcMethods))
	for _, m := range rpcMethods {
		r := &rpcMetrics{method: m, latency: newHistogram(b)}
		n.rpc[m] = r
		n.rpcAll = append(n.rpcAll, r)
	}
	n.rpcOther = &rpcMetrics{method: otherMethod, latency: newHistogram(b)}
	n.rpcAll = append(n.rpcAll, n.rpcOther)
}

// newObserver builds the Observer once: its funcs are closures over c,
// allocated here and never again, so calling them allocates nothing.
// BeforePublish stays nil because Published alone tells success from
// failure, and a nil field costs the publish path one nil check instead
// of a call. SettleRefused and Refreshed stay nil because Stats counts
// the same events per connection, in every mode (collectStats): counting
// them here too would count each twice, and without a connection label.
func (c *Collector) newObserver() *amqp.Observer {
	n := &c.n
	return &amqp.Observer{
		Published: func(_ context.Context, _ amqp.PublishInfo, err error) {
			if err != nil {
				n.publishErrors.Add(1)
				return
			}
			n.published.Add(1)
		},
		Confirmed: func(ci amqp.ConfirmInfo) {
			if ci.Ack {
				n.confirmedAck.Add(1)
			} else {
				n.confirmedNack.Add(1)
			}
			// Latency 0 means the client does not know it; observing it
			// would pile fake zero-latency confirms into the first bucket.
			if ci.Latency > 0 {
				n.confirmLatency.observe(ci.Latency)
			}
		},
		Returned: func(*amqp.Return) {
			n.returned.Add(1)
		},
		Delivered: func(*amqp.Delivery) {
			n.delivered.Add(1)
		},
		Handled: func(_ *amqp.Delivery, took time.Duration, err error) {
			n.handler.observe(took)
			if err != nil {
				n.handlerErrors.Add(1)
			}
		},
		Settled: func(si amqp.SettleInfo) {
			k := int(si.Kind)
			if k >= settleKinds {
				k = 0
			}
			n.settled[k].Add(1)
		},
		RPC: func(ri amqp.RPCInfo) {
			r := n.rpc[ri.Method]
			if r == nil {
				r = n.rpcOther
			}
			r.latency.observe(ri.Latency)
			if ri.Err != nil {
				r.errors.Add(1)
			}
		},
		BudgetPaused: func(amqp.BudgetInfo) {
			n.budgetPauses.Add(1)
		},
		BudgetResumed: func(bi amqp.BudgetInfo) {
			n.budgetPause.observe(bi.Paused)
		},
		ListenerDropped: func(amqp.ListenerStats) {
			n.listenersDropped.Add(1)
		},
		Connection: func(ev amqp.ConnectionEvent) {
			k := int(ev.Kind)
			if k >= connKinds {
				k = 0
			}
			n.connEvents[k].Add(1)
		},
	}
}

// collectObserver sends the Observer's counters. Counters with a label
// whose values are known (outcome, settle kind, connection event kind)
// are sent for every value, zeros included, so that rate() and absent()
// work from the first scrape; the RPC series appear with their method's
// first call, since most of the 60-odd methods are never called.
func (c *Collector) collectObserver(ch chan<- prometheus.Metric) {
	n, d := &c.n, &c.d
	counter := func(desc *prometheus.Desc, v *atomic.Uint64, labelValues ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v.Load()), labelValues...)
	}

	counter(d.published, &n.published)
	counter(d.publishErrors, &n.publishErrors)
	counter(d.confirmed, &n.confirmedAck, "ack")
	counter(d.confirmed, &n.confirmedNack, "nack")
	ch <- n.confirmLatency.metric(d.confirmLatency)
	counter(d.returned, &n.returned)
	counter(d.delivered, &n.delivered)
	ch <- n.handler.metric(d.handler)
	counter(d.handlerErrors, &n.handlerErrors)
	for k := range settleKinds {
		if k == 0 && n.settled[0].Load() == 0 {
			continue // no unknown kind seen: no "unknown" series
		}
		kind := amqp.SettleKind(k).String()
		counter(d.settled, &n.settled[k], kind)
	}
	for _, r := range n.rpcAll {
		if r.latency.count() == 0 {
			continue
		}
		ch <- r.latency.metric(d.rpc, r.method)
		counter(d.rpcErrors, &r.errors, r.method)
	}
	counter(d.budgetPauses, &n.budgetPauses)
	ch <- n.budgetPause.metric(d.budgetPause)
	counter(d.listenersDropped, &n.listenersDropped)
	for k := range connKinds {
		if k == 0 && n.connEvents[0].Load() == 0 {
			continue
		}
		counter(d.connectionEvents, &n.connEvents[k], amqp.ConnectionEventKind(k).String())
	}
}
