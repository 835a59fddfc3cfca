package otelamqp

import (
	"context"
	"errors"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Names of the metrics RegisterStats observes.
const (
	MetricBudgetUsed       = "amqp091.budget.used"
	MetricBudgetLimit      = "amqp091.budget.limit"
	MetricBudgetPaused     = "amqp091.budget.paused"
	MetricListenerQueued   = "amqp091.listener.queued"
	MetricConsumerQueued   = "amqp091.consumer.queued"
	MetricConnectionBytes  = "amqp091.connection.io"
	MetricCredentialExpiry = "amqp091.credential.expiry"
)

// listenerKinds are the kinds RegisterStats always reports, with 0 when
// nothing of the kind waits, so that a kind's series does not come and go
// with its queue.
var listenerKinds = []amqp.ListenerKind{
	amqp.KindNotifyPublish,
	amqp.KindNotifyReturn,
	amqp.KindNotifyFlow,
	amqp.KindNotifyCancel,
	amqp.KindNotifyBlocked,
	amqp.KindDeferredConfirmation,
}

// RegisterStats registers a callback with the MeterProvider that reads
// conn.Stats() at each collection and reports:
//
//   - amqp091.budget.used (By): bytes read that wait for a user;
//   - amqp091.budget.limit (By): the drainer's budget (0 in legacy mode);
//   - amqp091.budget.paused: 1 while reading is paused for the budget;
//   - amqp091.listener.queued ({notification}): notifications waiting for
//     listeners, summed over channels, by amqp091.listener.kind;
//   - amqp091.consumer.queued ({message}): deliveries waiting in consumer
//     buffers, summed over consumers (consumer tags are too many to be
//     attributes);
//   - amqp091.connection.io (By), a counter: bytes read and written, by
//     network.io.direction;
//   - amqp091.credential.expiry (s): when the secret the broker holds
//     expires, in Unix seconds, only while the connection's credentials
//     expire (amqp.ExpiringAuth); in every mode, upstream's with
//     Config.SafeRecovery. The time left is this minus the present.
//
// Every observation carries amqp091.read_mode and the WithAttributes and
// WithServerAddress attributes: give each connection an attribute of its
// own when several report to one MeterProvider, or their series collide.
//
// Call unregister when the connection is closed; the callback holds conn
// until then. Stats is safe to call after Close, so an unregister that
// comes late does no harm.
func RegisterStats(conn *amqp.Connection, opts ...Option) (unregister func() error, err error) {
	if conn == nil {
		return nil, errors.New("otelamqp: RegisterStats: nil connection")
	}
	cfg := newConfig(opts)
	m := cfg.meter()
	used, err1 := m.Int64ObservableGauge(MetricBudgetUsed, metric.WithUnit("By"),
		metric.WithDescription("Bytes read from the socket that wait for a user."))
	limit, err2 := m.Int64ObservableGauge(MetricBudgetLimit, metric.WithUnit("By"),
		metric.WithDescription("The drainer's memory budget; 0 when the read path keeps none."))
	paused, err3 := m.Int64ObservableGauge(MetricBudgetPaused, metric.WithUnit("1"),
		metric.WithDescription("1 while the drainer's reading is paused for the budget, else 0."))
	listeners, err4 := m.Int64ObservableGauge(MetricListenerQueued, metric.WithUnit("{notification}"),
		metric.WithDescription("Notifications waiting for a listener, by kind."))
	consumers, err5 := m.Int64ObservableGauge(MetricConsumerQueued, metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries waiting in consumer buffers."))
	io, err6 := m.Int64ObservableCounter(MetricConnectionBytes, metric.WithUnit("By"),
		metric.WithDescription("Bytes read from and written to the socket."))
	// A time, not the seconds left: the seconds left would be as old as
	// the last export when an alert reads them, and overstate them by up
	// to an export interval, whereas the backend subtracts the present
	// from a time exactly; and a time changes only when a new secret is
	// installed (a refresh, a login), so its series shows each one.
	expiry, err7 := m.Float64ObservableGauge(MetricCredentialExpiry, metric.WithUnit("s"),
		metric.WithDescription("When the secret the broker holds for the connection expires, in Unix seconds; reported only while its credentials expire."))
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7); err != nil {
		return nil, err
	}

	base := baseAttrs(&cfg)
	// The sets depend on the mode, which Stats reports and which stays
	// the same for the connection's life: build them at the first
	// collection and keep them, so that a collection allocates little.
	// The mutex is for readers that collect concurrently: each one runs
	// the callback.
	var (
		mu                     sync.Mutex
		mode                   string
		baseSet, inSet, outSet attribute.Set
		kindSets               map[amqp.ListenerKind]attribute.Set
		kindQueued             map[amqp.ListenerKind]int64
	)
	buildSets := func(m string) {
		mode = m
		all := append(base[:len(base):len(base)], AttrReadMode.String(m))
		baseSet = attribute.NewSet(all...)
		inSet = extend(baseSet, attribute.String("network.io.direction", "receive"))
		outSet = extend(baseSet, attribute.String("network.io.direction", "transmit"))
		kindSets = make(map[amqp.ListenerKind]attribute.Set, len(listenerKinds))
		for _, k := range listenerKinds {
			kindSets[k] = extend(baseSet, AttrListenerKind.String(string(k)))
		}
		kindQueued = make(map[amqp.ListenerKind]int64, len(listenerKinds))
	}
	with := metric.WithAttributeSet

	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := conn.Stats()
		mu.Lock()
		defer mu.Unlock()
		if kindSets == nil || s.Mode != mode {
			buildSets(s.Mode)
		}
		o.ObserveInt64(used, s.Budget.Used, with(baseSet))
		o.ObserveInt64(limit, s.Budget.Limit, with(baseSet))
		var p int64
		if s.Budget.Paused {
			p = 1
		}
		o.ObserveInt64(paused, p, with(baseSet))
		clear(kindQueued)
		for _, l := range s.Listeners {
			if _, ok := kindSets[l.Kind]; !ok {
				// A kind this package does not list (yet).
				kindSets[l.Kind] = extend(baseSet, AttrListenerKind.String(string(l.Kind)))
			}
			kindQueued[l.Kind] += int64(l.Queued)
		}
		for k, set := range kindSets {
			o.ObserveInt64(listeners, kindQueued[k], with(set))
		}
		var queued int64
		for _, c := range s.Consumers {
			queued += int64(c.Queued)
		}
		o.ObserveInt64(consumers, queued, with(baseSet))
		o.ObserveInt64(io, int64(s.BytesIn), with(inSet))
		o.ObserveInt64(io, int64(s.BytesOut), with(outSet))
		// Zero: the credentials do not expire. Reporting 0 would read as
		// a secret that expired in 1970 and trip every alert on the time
		// left, so the gauge has no data point instead.
		if e := s.Credentials.Expires; !e.IsZero() {
			o.ObserveFloat64(expiry, float64(e.Unix())+float64(e.Nanosecond())/1e9, with(baseSet))
		}
		return nil
	}, used, limit, paused, listeners, consumers, io, expiry)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}
