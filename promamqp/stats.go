package promamqp

import (
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/prometheus/client_golang/prometheus"
)

// listenerKinds are the listener kinds whose gauges are sent even when
// nothing waits for them, as long as channel labels are off: a series
// that vanishes whenever its queue empties breaks alerts that compare it
// over time. With channel labels there is no such set to fill in, since
// which channels exist is the application's business.
var listenerKinds = []amqp.ListenerKind{
	amqp.KindNotifyPublish,
	amqp.KindNotifyReturn,
	amqp.KindNotifyFlow,
	amqp.KindNotifyCancel,
	amqp.KindNotifyBlocked,
	amqp.KindDeferredConfirmation,
}

// queued sums what waits for one label set.
type queued struct {
	n      int
	bytes  int64
	oldest time.Duration
}

func (q *queued) add(n int, bytes int64, oldest time.Duration) {
	q.n += n
	q.bytes += bytes
	q.oldest = max(q.oldest, oldest)
}

type listenerKey struct {
	kind    amqp.ListenerKind
	channel uint16
}

type consumerKey struct {
	channel uint16
	tag     string
}

// collectStats sends the metrics of one watched connection from its
// snapshot s.
func (c *Collector) collectStats(ch chan<- prometheus.Metric, name string, s *amqp.Stats) {
	d := &c.d
	send := func(desc *prometheus.Desc, t prometheus.ValueType, v float64, labelValues ...string) {
		ch <- prometheus.MustNewConstMetric(desc, t, v, labelValues...)
	}
	gauge := prometheus.GaugeValue
	counter := prometheus.CounterValue

	send(d.info, gauge, 1, name, s.Mode)
	send(d.framesIn, counter, float64(s.FramesIn), name)
	// Counted in every mode (upstream's with Config.SafeRecovery).
	send(d.settleRefused, counter, float64(s.StaleSettlements), name, "stale_delivery")
	send(d.settleRefused, counter, float64(s.UnknownTagSettlements), name, "unknown_delivery_tag")
	cs := &s.Credentials
	send(d.credentialRefreshes, counter, float64(cs.Refreshes), name)
	send(d.credentialRefreshErrors, counter, float64(cs.Failures), name)
	// A zero Expires means no expiring credentials: a 0 timestamp would
	// read as "expired in 1970" and fire every expiry alert.
	if !cs.Expires.IsZero() {
		// Seconds and fraction apart: UnixNano()/1e9 rounds 1e18 in a
		// float64 first, and .25 s would come out as .2499998.
		at := float64(cs.Expires.Unix()) + float64(cs.Expires.Nanosecond())/1e9
		send(d.credentialExpiry, gauge, at, name)
	}
	if s.Mode == "upstream" {
		// Upstream's reader counts the frames it dispatches and nothing
		// else (amqp.Stats): a 0 for the rest would read as "no traffic"
		// rather than "not measured", so those series are left out.
		return
	}
	send(d.framesOut, counter, float64(s.FramesOut), name)
	send(d.bytesIn, counter, float64(s.BytesIn), name)
	send(d.bytesOut, counter, float64(s.BytesOut), name)
	send(d.writes, counter, float64(s.Writes), name)
	send(d.coalescedPublishes, counter, float64(s.CoalescedPublishes), name)

	b := &s.Budget
	send(d.budgetLimit, gauge, float64(b.Limit), name)
	send(d.budgetUsed, gauge, float64(b.Used), name)
	paused := 0.0
	if b.Paused {
		paused = 1
	}
	send(d.budgetPaused, gauge, paused, name)
	send(d.budgetPausedSeconds, counter, b.PausedTotal.Seconds(), name)

	// Listeners: summed per kind, or per kind and channel.
	listeners := make(map[listenerKey]*queued, len(listenerKinds))
	if !c.cfg.channelLabels {
		for _, k := range listenerKinds {
			listeners[listenerKey{kind: k}] = &queued{}
		}
	}
	for _, l := range s.Listeners {
		k := listenerKey{kind: l.Kind}
		if c.cfg.channelLabels {
			k.channel = l.Channel
		}
		q := listeners[k]
		if q == nil {
			q = &queued{}
			listeners[k] = q
		}
		q.add(l.Queued, l.QueuedBytes, l.OldestAge)
	}
	// No sorting: the registry sorts what it gathers.
	for k, q := range listeners {
		lv := []string{name, string(k.kind)}
		if c.cfg.channelLabels {
			lv = append(lv, strconv.Itoa(int(k.channel)))
		}
		send(d.listenerQueued, gauge, float64(q.n), lv...)
		send(d.listenerQueuedBytes, gauge, float64(q.bytes), lv...)
		send(d.listenerOldest, gauge, q.oldest.Seconds(), lv...)
	}

	// Consumers: summed over the connection, or per channel and/or tag.
	consumers := make(map[consumerKey]*queued, 1)
	if !c.cfg.channelLabels && !c.cfg.consumerTagLabels {
		consumers[consumerKey{}] = &queued{}
	}
	for _, cs := range s.Consumers {
		var k consumerKey
		if c.cfg.channelLabels {
			k.channel = cs.Channel
		}
		if c.cfg.consumerTagLabels {
			k.tag = cs.ConsumerTag
		}
		q := consumers[k]
		if q == nil {
			q = &queued{}
			consumers[k] = q
		}
		q.add(cs.Queued, cs.QueuedBytes, cs.OldestAge)
	}
	for k, q := range consumers {
		lv := []string{name}
		if c.cfg.channelLabels {
			lv = append(lv, strconv.Itoa(int(k.channel)))
		}
		if c.cfg.consumerTagLabels {
			lv = append(lv, k.tag)
		}
		send(d.consumerQueued, gauge, float64(q.n), lv...)
		send(d.consumerQueuedBytes, gauge, float64(q.bytes), lv...)
		send(d.consumerOldest, gauge, q.oldest.Seconds(), lv...)
	}
}
