package otelamqp

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
)

// Names of the metrics that the semantic conventions do not define.
const (
	MetricPublishConfirmed    = "amqp091.publish.confirmed"
	MetricPublishNacked       = "amqp091.publish.nacked"
	MetricPublishReturned     = "amqp091.publish.returned"
	MetricConfirmLatency      = "amqp091.confirm.latency"
	MetricDeliveryAcked       = "amqp091.delivery.acked"
	MetricDeliveryNacked      = "amqp091.delivery.nacked"
	MetricDeliveryRejected    = "amqp091.delivery.rejected"
	MetricSettleRefused       = "amqp091.delivery.settle_refused"
	MetricRPCDuration         = "amqp091.rpc.duration"
	MetricBudgetPauses        = "amqp091.budget.pauses"
	MetricBudgetPauseTime     = "amqp091.budget.pause.duration"
	MetricListenerDropped     = "amqp091.listener.dropped"
	MetricConnectionEvents    = "amqp091.connection.events"
	MetricCredentialRefreshes = "amqp091.credential.refreshes"
)

// Attribute keys of this instrumentation, for what the semantic
// conventions have no name for.
const (
	AttrRPCMethod       = attribute.Key("amqp091.rpc.method")       // "queue.declare"
	AttrListenerKind    = attribute.Key("amqp091.listener.kind")    // "NotifyPublish", ...
	AttrConnectionEvent = attribute.Key("amqp091.connection.event") // "opened", "failed", ...
	AttrReadMode        = attribute.Key("amqp091.read_mode")        // "drainer", "legacy", ...
	AttrRequeue         = attribute.Key("amqp091.requeue")          // nack and reject
	AttrReplyCode       = attribute.Key("amqp091.reply_code")       // basic.return
	AttrSettleKind      = attribute.Key("amqp091.settle.kind")      // "ack", "nack", "reject"
)

// durationBuckets are the histogram bounds, in seconds, of every duration
// this package records. The semantic conventions advise bounds that start
// at 5 ms; a publish or a confirm on a nearby broker takes tens of
// microseconds to a millisecond, which those would lump into one bucket.
var durationBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
	0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// observer holds what the hooks share. Its methods are the Observer's
// funcs.
type observer struct {
	tracer       trace.Tracer
	prop         propagation.TextMapPropagator
	handledSpans bool

	// spanBase are the attributes every span starts with
	// (messaging.system, server, the user's); metricBase the same for
	// data points.
	spanBase []attribute.KeyValue
	dests    destCache

	sent            messagingconv.ClientSentMessages
	consumed        messagingconv.ClientConsumedMessages
	opDuration      messagingconv.ClientOperationDuration
	processDuration messagingconv.ProcessDuration

	confirmed, nacked, returned metric.Int64Counter
	confirmLatency              metric.Float64Histogram
	acked, nackedD, rejected    metric.Int64Counter
	settleRefused               metric.Int64Counter
	rpcDuration                 metric.Float64Histogram
	budgetPauses                metric.Int64Counter
	budgetPauseTime             metric.Float64Histogram
	listenerDropped             metric.Int64Counter
	connEvents                  metric.Int64Counter
	credentialRefreshes         metric.Int64Counter

	// Sets built once for the hooks whose attributes do not vary per
	// message, so that recording does not allocate.
	base                measureSet
	requeueSet, dropSet measureSet // nack/reject with requeue true and false

	rpcMu   sync.RWMutex
	rpcSets map[string]measureSet // by method, for calls without error
}

// Span start options that never change, boxed once.
var (
	producerKind = trace.WithSpanKind(trace.SpanKindProducer)
	clientKind   = trace.WithSpanKind(trace.SpanKindClient)
	consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
)

// NewObserver returns an Observer that traces publishes and deliveries
// and records metrics, following the OpenTelemetry semantic conventions
// for messaging (messaging.system "rabbitmq"). Set it as
// DrainerOptions.Observer or LegacyOptions.Observer; upstream mode calls
// no Observer.
//
// One Observer may serve several connections. Its funcs may be wrapped or
// replaced, field by field, by the application.
func NewObserver(opts ...Option) *amqp.Observer {
	cfg := newConfig(opts)
	o := newObserver(&cfg)
	return &amqp.Observer{
		BeforePublish:   o.beforePublish,
		Published:       o.published,
		Confirmed:       o.confirmedHook,
		Returned:        o.returnedHook,
		Delivered:       o.delivered,
		Handled:         o.handled,
		Settled:         o.settled,
		SettleRefused:   o.refusedHook,
		RPC:             o.rpc,
		BudgetPaused:    o.budgetPaused,
		BudgetResumed:   o.budgetResumed,
		ListenerDropped: o.listenerDroppedHook,
		Connection:      o.connection,
		Refreshed:       o.refreshedHook,
	}
}

func baseAttrs(cfg *config) []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.MessagingSystemRabbitMQ}
	if cfg.serverAddress != "" {
		attrs = append(attrs, semconv.ServerAddress(cfg.serverAddress))
		if cfg.serverPort > 0 {
			attrs = append(attrs, semconv.ServerPort(cfg.serverPort))
		}
	}
	return append(attrs, cfg.attrs...)
}

func newObserver(cfg *config) *observer {
	base := baseAttrs(cfg)
	o := &observer{
		tracer:       cfg.tracer(),
		prop:         cfg.prop,
		handledSpans: cfg.handledSpans,
		spanBase:     base,
		dests:        destCache{base: base},
		base:         newMeasureSet(attribute.NewSet(base...)),
		requeueSet:   newMeasureSet(attribute.NewSet(append(base[:len(base):len(base)], AttrRequeue.Bool(true))...)),
		dropSet:      newMeasureSet(attribute.NewSet(append(base[:len(base):len(base)], AttrRequeue.Bool(false))...)),
		rpcSets:      map[string]measureSet{},
	}
	m := cfg.meter()
	var err error
	// An instrument that cannot be created is reported to the global
	// error handler and left a no-op: instrumentation must not stop the
	// application from dialling.
	handle := func(e error) {
		if e != nil {
			otel.Handle(e)
		}
	}
	buckets := metric.WithExplicitBucketBoundaries(durationBuckets...)
	o.sent, err = messagingconv.NewClientSentMessages(m)
	handle(err)
	o.consumed, err = messagingconv.NewClientConsumedMessages(m)
	handle(err)
	o.opDuration, err = messagingconv.NewClientOperationDuration(m, buckets)
	handle(err)
	o.processDuration, err = messagingconv.NewProcessDuration(m, buckets)
	handle(err)

	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		handle(err)
		return c
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), buckets)
		handle(err)
		return h
	}
	o.confirmed = counter(MetricPublishConfirmed, "{message}", "Publishes the broker confirmed (basic.ack).")
	o.nacked = counter(MetricPublishNacked, "{message}", "Publishes the broker refused (basic.nack).")
	o.returned = counter(MetricPublishReturned, "{message}", "Publishes the broker returned as unroutable (basic.return).")
	o.confirmLatency = histogram(MetricConfirmLatency, "Time from a publish's write to its confirm.")
	o.acked = counter(MetricDeliveryAcked, "{call}", "Deliveries the application acked; a multiple ack counts once.")
	o.nackedD = counter(MetricDeliveryNacked, "{call}", "Deliveries the application nacked; a multiple nack counts once.")
	o.rejected = counter(MetricDeliveryRejected, "{call}", "Deliveries the application rejected.")
	o.settleRefused = counter(MetricSettleRefused, "{call}", "Acks, nacks and rejects refused and not sent: error.type stale_delivery for a delivery from before its channel recovered, unknown_delivery_tag for a tag never handed out.")
	o.rpcDuration = histogram(MetricRPCDuration, "Time from a synchronous method's request to its reply.")
	o.budgetPauses = counter(MetricBudgetPauses, "{pause}", "Times the drainer stopped reading because its memory budget was full.")
	o.budgetPauseTime = histogram(MetricBudgetPauseTime, "How long the drainer's reading paused for the budget.")
	o.listenerDropped = counter(MetricListenerDropped, "{listener}", "Listeners closed by the stall policy.")
	o.connEvents = counter(MetricConnectionEvents, "{event}", "Connection opens, recoveries, closes and failures.")
	o.credentialRefreshes = counter(MetricCredentialRefreshes, "{refresh}", "Refreshes of expiring credentials (OAuth 2 tokens) with update-secret; a failed one has error.type provider (the provider failed, hung or returned nothing), expired (it returned an expired secret) or refused (the broker refused update-secret, or the connection closed).")
	return o
}

// publishCtx is the context BeforePublish hands to Published: the span's
// context plus what Published needs, in one allocation rather than a
// context.WithValue per field. The carrier lives in it too, for the same
// reason: the propagator would make a carrier of its own escape.
type publishCtx struct {
	context.Context
	span    trace.Span
	start   time.Time
	dest    *destination
	carrier copyOnWriteCarrier
}

// publishKey finds a publishCtx under contexts derived from it.
type publishKey struct{}

// Value returns pc for publishKey, so that Published finds it even when a
// wrapping BeforePublish derived a context from the one this package's
// returned.
func (pc *publishCtx) Value(key any) any {
	if key == (publishKey{}) {
		return pc
	}
	return pc.Context.Value(key)
}

func (o *observer) beforePublish(ctx context.Context, info amqp.PublishInfo, msg *amqp.Publishing) context.Context {
	start := time.Now()
	dest := o.dests.get(opKindPublish, info.Exchange, info.RoutingKey)
	attrs := make([]attribute.KeyValue, 0, len(o.spanBase)+10)
	attrs = append(attrs, o.spanBase...)
	attrs = append(attrs,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName(opPublish),
		semconv.MessagingMessageBodySize(info.BodySize))
	attrs = dest.spanAttrs(attrs, info.RoutingKey)
	attrs = messageAttrs(attrs, msg.MessageId, msg.CorrelationId)
	ctx, span := o.tracer.Start(ctx, dest.spanName, producerKind, trace.WithAttributes(attrs...))
	pc := &publishCtx{Context: ctx, span: span, start: start, dest: dest}
	// The caller's Table is theirs: the carrier replaces msg.Headers by a
	// copy before its first write.
	pc.carrier.msg = msg
	o.prop.Inject(ctx, &pc.carrier)
	pc.carrier.msg = nil // msg is the caller's: do not keep it past the call
	return pc
}

func (o *observer) published(ctx context.Context, info amqp.PublishInfo, err error) {
	pc, ok := ctx.(*publishCtx)
	if !ok {
		pc, ok = ctx.Value(publishKey{}).(*publishCtx)
	}
	if !ok {
		// Not a context beforePublish made (another hook replaced it,
		// say): the span may still be in it; the start time is not.
		span := trace.SpanFromContext(ctx)
		endSpan(span, info.DeliveryTag, err)
		o.countSent(ctx, o.dests.get(opKindPublish, info.Exchange, info.RoutingKey), err)
		return
	}
	endSpan(pc.span, info.DeliveryTag, err)
	o.countSent(ctx, pc.dest, err)
	took := time.Since(pc.start).Seconds()
	if err != nil {
		o.opDuration.Float64Histogram.Record(ctx, took, metric.WithAttributeSet(withError(pc.dest.duration.set, err)))
		return
	}
	o.opDuration.Float64Histogram.Record(ctx, took, pc.dest.duration.record...)
}

func endSpan(span trace.Span, tag uint64, err error) {
	if tag != 0 {
		span.SetAttributes(semconv.MessagingRabbitMQMessageDeliveryTag(int(tag)))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(errorType(err))
	}
	span.End()
}

func (o *observer) countSent(ctx context.Context, dest *destination, err error) {
	if err != nil {
		o.sent.Int64Counter.Add(ctx, 1, metric.WithAttributeSet(withError(dest.count.set, err)))
		return
	}
	o.sent.Int64Counter.Add(ctx, 1, dest.count.add...)
}

func (o *observer) confirmedHook(ci amqp.ConfirmInfo) {
	ctx := context.Background()
	if ci.Ack {
		o.confirmed.Add(ctx, 1, o.base.add...)
	} else {
		o.nacked.Add(ctx, 1, o.base.add...)
	}
	// 0 means the read path does not know when the publish was written;
	// recording it would drag the distribution towards zero.
	if ci.Latency > 0 {
		o.confirmLatency.Record(ctx, ci.Latency.Seconds(), o.base.record...)
	}
}

func (o *observer) returnedHook(r *amqp.Return) {
	dest := o.dests.get(opKindReturn, r.Exchange, r.RoutingKey)
	// Returns are rare (unroutable mandatory publishes), so building the
	// set with its reply code on each is cheap enough.
	set := extend(dest.count.set, AttrReplyCode.Int(int(r.ReplyCode)))
	o.returned.Add(context.Background(), 1, metric.WithAttributeSet(set))
}

// consumerSpanAttrs are the attributes of the receive and process spans of
// d.
func (o *observer) consumerSpanAttrs(kind op, d *amqp.Delivery) (*destination, []attribute.KeyValue) {
	dest := o.dests.get(kind, d.Exchange, d.RoutingKey)
	attrs := make([]attribute.KeyValue, 0, len(o.spanBase)+10)
	attrs = append(attrs, o.spanBase...)
	attrs = append(attrs,
		kind.typ(),
		semconv.MessagingOperationName(kind.name()),
		semconv.MessagingMessageBodySize(len(d.Body)),
		semconv.MessagingRabbitMQMessageDeliveryTag(int(d.DeliveryTag)))
	attrs = dest.spanAttrs(attrs, d.RoutingKey)
	attrs = messageAttrs(attrs, d.MessageId, d.CorrelationId)
	return dest, attrs
}

func messageAttrs(attrs []attribute.KeyValue, id, correlation string) []attribute.KeyValue {
	if id != "" {
		attrs = append(attrs, semconv.MessagingMessageID(id))
	}
	if correlation != "" {
		attrs = append(attrs, semconv.MessagingMessageConversationID(correlation))
	}
	return attrs
}

func (o *observer) delivered(d *amqp.Delivery) {
	ctx := context.Background()
	dest, attrs := o.consumerSpanAttrs(opKindReceive, d)
	opts := []trace.SpanStartOption{
		// The conventions make receive spans CLIENT spans; CONSUMER is
		// for process spans.
		clientKind,
		trace.WithAttributes(attrs...),
	}
	if link, ok := o.producerLink(d); ok {
		opts = append(opts, trace.WithLinks(link))
	}
	// A root span: the delivery arrives on the read path, outside any
	// operation of the application's; the link ties it to its producer.
	_, span := o.tracer.Start(ctx, dest.spanName, opts...)
	span.End()
	o.consumed.Int64Counter.Add(ctx, 1, dest.count.add...)
}

// producerLink is a link to the span context the producer injected into
// d's headers.
func (o *observer) producerLink(d *amqp.Delivery) (trace.Link, bool) {
	if len(d.Headers) == 0 {
		return trace.Link{}, false
	}
	sc := trace.SpanContextFromContext(o.prop.Extract(context.Background(), HeaderCarrier(d.Headers)))
	if !sc.IsValid() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc}, true
}

func (o *observer) handled(d *amqp.Delivery, took time.Duration, err error) {
	end := time.Now()
	dest := o.dests.get(opKindProcess, d.Exchange, d.RoutingKey)
	if o.handledSpans {
		// Started when the handler started: the read path reports only
		// how long it took.
		_, span := o.startProcess(context.Background(), d, trace.WithTimestamp(end.Add(-took)))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(errorType(err))
		}
		span.End(trace.WithTimestamp(end))
	}
	if err != nil {
		o.processDuration.Float64Histogram.Record(context.Background(), took.Seconds(), metric.WithAttributeSet(withError(dest.count.set, err)))
		return
	}
	o.processDuration.Float64Histogram.Record(context.Background(), took.Seconds(), dest.count.record...)
}

// startProcess starts the process span of d: a CONSUMER span, child of
// the producer's span when d carries its context (else of ctx's span),
// and linked to it as the conventions ask of a single-message process
// span.
func (o *observer) startProcess(ctx context.Context, d *amqp.Delivery, extra ...trace.SpanStartOption) (context.Context, trace.Span) {
	dest, attrs := o.consumerSpanAttrs(opKindProcess, d)
	opts := make([]trace.SpanStartOption, 0, len(extra)+3)
	opts = append(opts, extra...)
	opts = append(opts, consumerKind, trace.WithAttributes(attrs...))
	if len(d.Headers) > 0 {
		pctx := o.prop.Extract(ctx, HeaderCarrier(d.Headers))
		if sc := trace.SpanContextFromContext(pctx); sc.IsValid() && sc.IsRemote() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			ctx = pctx
		}
	}
	return o.tracer.Start(ctx, dest.spanName, opts...)
}

func (o *observer) settled(si amqp.SettleInfo) {
	var c metric.Int64Counter
	set := o.base
	switch si.Kind {
	case amqp.SettleAck:
		c = o.acked
	case amqp.SettleNack:
		c = o.nackedD
	case amqp.SettleReject:
		c = o.rejected
	default:
		return
	}
	if si.Kind != amqp.SettleAck {
		set = o.dropSet
		if si.Requeue {
			set = o.requeueSet
		}
	}
	c.Add(context.Background(), 1, set.add...)
}

// refusedHook counts an Ack, Nack or Reject that the connection refused
// (a stale or unknown tag). It is rare, so it builds its set each time.
func (o *observer) refusedHook(si amqp.SettleInfo, err error) {
	reason := "unknown_delivery_tag"
	if errors.Is(err, amqp.ErrStaleDelivery) {
		reason = "stale_delivery"
	}
	set := extend(o.base.set, AttrSettleKind.String(si.Kind.String()), semconv.ErrorTypeKey.String(reason))
	o.settleRefused.Add(context.Background(), 1, metric.WithAttributeSet(set))
}

// refreshedHook counts a refresh of expiring credentials, on the
// refresh's goroutine. Refreshes come minutes apart, so a failure builds
// its set each time.
func (o *observer) refreshedHook(ri amqp.RefreshInfo) {
	if ri.Err == nil {
		o.credentialRefreshes.Add(context.Background(), 1, o.base.add...)
		return
	}
	set := extend(o.base.set, semconv.ErrorTypeKey.String(refreshFailure(ri.Err)))
	o.credentialRefreshes.Add(context.Background(), 1, metric.WithAttributeSet(set))
}

// refreshFailure is error.type for a failed refresh: one of three fixed
// values, never the error's text, which names the endpoint and may quote
// the provider's error. errorType would not do: a provider's error wraps
// whatever the provider returned, so error.type would take the
// application's error types as values. A refusal's reply code is on the
// connection.update-secret data point of amqp091.rpc.duration already.
func refreshFailure(err error) string {
	switch {
	case errors.Is(err, amqp.ErrCredentialsProvider):
		return "provider"
	case errors.Is(err, amqp.ErrCredentialsExpired):
		return "expired"
	default: // update-secret: the broker's *amqp.Error, or amqp.ErrClosed
		return "refused"
	}
}

func (o *observer) rpc(ri amqp.RPCInfo) {
	if ri.Err != nil {
		set := extend(o.base.set, AttrRPCMethod.String(ri.Method), errorType(ri.Err))
		o.rpcDuration.Record(context.Background(), ri.Latency.Seconds(), metric.WithAttributeSet(set))
		return
	}
	o.rpcDuration.Record(context.Background(), ri.Latency.Seconds(), o.rpcSet(ri.Method).record...)
}

// rpcSet caches the set of a method: there are a few dozen methods, and
// a connection calls some (channel.open, queue.declare) often.
func (o *observer) rpcSet(method string) measureSet {
	o.rpcMu.RLock()
	set, ok := o.rpcSets[method]
	o.rpcMu.RUnlock()
	if ok {
		return set
	}
	set = newMeasureSet(extend(o.base.set, AttrRPCMethod.String(method)))
	o.rpcMu.Lock()
	o.rpcSets[method] = set
	o.rpcMu.Unlock()
	return set
}

func (o *observer) budgetPaused(amqp.BudgetInfo) {
	o.budgetPauses.Add(context.Background(), 1, o.base.add...)
}

func (o *observer) budgetResumed(bi amqp.BudgetInfo) {
	o.budgetPauseTime.Record(context.Background(), bi.Paused.Seconds(), o.base.record...)
}

func (o *observer) listenerDroppedHook(ls amqp.ListenerStats) {
	set := extend(o.base.set, AttrListenerKind.String(string(ls.Kind)))
	o.listenerDropped.Add(context.Background(), 1, metric.WithAttributeSet(set))
}

func (o *observer) connection(ev amqp.ConnectionEvent) {
	attrs := []attribute.KeyValue{AttrConnectionEvent.String(ev.Kind.String()), AttrReadMode.String(ev.Mode)}
	if ev.Err != nil {
		attrs = append(attrs, errorType(ev.Err))
	}
	o.connEvents.Add(context.Background(), 1, metric.WithAttributeSet(extend(o.base.set, attrs...)))
}

// errorType is error.type for err: the AMQP reply code for an *amqp.Error
// (a low-cardinality class the broker chose, "406"), else what the
// conventions' ErrorType derives from the error's type.
func errorType(err error) attribute.KeyValue {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code != 0 {
		return semconv.ErrorTypeKey.String(strconv.Itoa(ae.Code))
	}
	return semconv.ErrorType(err)
}

func withError(set attribute.Set, err error) attribute.Set {
	return extend(set, errorType(err))
}

// extend returns set with attrs added.
func extend(set attribute.Set, attrs ...attribute.KeyValue) attribute.Set {
	all := append(set.ToSlice(), attrs...)
	return attribute.NewSet(all...)
}
