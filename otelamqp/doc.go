// Package otelamqp instruments amqp091-drainer's build of amqp091-go with
// OpenTelemetry: traces and metrics that follow the semantic conventions
// for messaging (semconv v1.43.0, messaging.system "rabbitmq"), fed by the
// Observer hooks of the drainer and legacy read paths. It is a module of
// its own so that the core module depends on no OpenTelemetry package.
//
// # The Observer
//
// NewObserver returns an *amqp.Observer; set it in the read path's
// options when dialling:
//
//	obs := otelamqp.NewObserver(
//		otelamqp.WithTracerProvider(tp),   // default: otel.GetTracerProvider()
//		otelamqp.WithMeterProvider(mp),    // default: otel.GetMeterProvider()
//		otelamqp.WithPropagators(propagation.TraceContext{}), // default: otel.GetTextMapPropagator()
//	)
//	conn, err := amqp.DialConfig(url, amqp.Config{
//		ReadPath: amqp.Drainer(amqp.DrainerOptions{Observer: obs}),
//	})
//
// or amqp.Legacy(amqp.LegacyOptions{Observer: obs}). Upstream mode (a
// Config with no ReadPath, and no process default) calls no Observer:
// its code paths stay upstream's, so a connection in that mode is not
// instrumented at all. Within the observed modes, only
// PublishWithContext and PublishWithDeferredConfirmWithContext are
// observed; Publish and PublishWithDeferredConfirm run upstream's code.
//
// The global propagator propagates nothing until the application sets
// one; without a propagator, consumer spans have no producer to link to.
// Set it once, as for any OpenTelemetry instrumentation:
//
//	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
//		propagation.TraceContext{}, propagation.Baggage{}))
//
// # Spans
//
// Each publish gets a PRODUCER span, "publish <exchange>" ("publish
// <queue>" through the default exchange, plain "publish" to a
// server-named queue, whose one-off name would make span names of high
// cardinality), child of the span in PublishWithContext's ctx. It carries
// messaging.destination.name ("<exchange>:<routing key>", or whichever of
// the two is not empty), messaging.rabbitmq.destination.routing_key,
// messaging.message.body.size, messaging.message.id,
// messaging.message.conversation_id (the correlation id) and, in confirm
// mode, messaging.rabbitmq.message.delivery_tag. It ends when the message
// is written, with an error status if the publish failed.
//
// Each delivery gets a "receive" span (CLIENT, as the conventions have
// it) when the read path decodes it: a root span with a link to the
// producer's span. The code that handles the message gets a CONSUMER
// "process" span, child of the producer's span and linked to it: from
// the Observer when a Channel.ConsumeFunc handler returns (its start is
// when the handler started; an error from the handler sets its status),
// or from StartProcessSpan, which a Channel.Consume loop calls itself:
//
//	for d := range deliveries {
//		ctx, span := otelamqp.StartProcessSpan(ctx, &d, opts...)
//		err := handle(ctx, d)
//		...
//		span.End()
//	}
//
// When a ConsumeFunc handler calls StartProcessSpan itself, make the
// Observer WithHandledSpans(false), or each message gets two process
// spans.
//
// # Header propagation
//
// Before a message is encoded, the Observer injects the producer span's
// context into its headers (traceparent and tracestate with the W3C
// propagator). It never writes into the caller's Table: the first header
// it writes replaces the Publishing's Headers by a copy of the caller's,
// so a Table reused for many publishes, or shared between goroutines,
// stays as the caller left it. When the propagator writes nothing, no copy
// is made.
//
// On the consumer side, ContextFromDelivery returns a context with the
// producer's span context, extracted from the delivery's headers as a
// remote span context, for code that starts its own spans; HeaderCarrier
// adapts any amqp.Table to a propagation.TextMapCarrier. Header values
// sent by other clients as byte arrays are read as well as strings.
//
// # Metrics
//
// The Observer records the conventions' messaging.client.sent.messages,
// messaging.client.consumed.messages, messaging.client.operation.duration
// (publish) and messaging.process.duration (ConsumeFunc handlers), and
// amqp091.publish.confirmed, amqp091.publish.nacked,
// amqp091.publish.returned, amqp091.confirm.latency (seconds),
// amqp091.delivery.acked, amqp091.delivery.nacked,
// amqp091.delivery.rejected, amqp091.delivery.settle_refused (error.type
// stale_delivery or unknown_delivery_tag), amqp091.rpc.duration (by
// amqp091.rpc.method), amqp091.budget.pauses,
// amqp091.budget.pause.duration, amqp091.listener.dropped,
// amqp091.connection.events and amqp091.credential.refreshes (expiring
// credentials refreshed with update-secret; error.type provider, expired
// or refused on a failure, a fixed set that never carries the error's
// text or a secret). Data points to a server-named queue carry
// messaging.destination.anonymous instead of its name, which is new for
// every queue. A delivery is counted consumed when the read path decodes
// it, before the application receives it; acknowledgements count calls,
// so a multiple ack counts once.
//
// RegisterStats adds observable gauges read from (*amqp.Connection).Stats
// at each collection: the drainer's budget (amqp091.budget.used,
// amqp091.budget.limit, amqp091.budget.paused), what waits for listeners
// (amqp091.listener.queued, by amqp091.listener.kind) and for consumers
// (amqp091.consumer.queued), the bytes moved (amqp091.connection.io), and
// when the secret the broker holds expires (amqp091.credential.expiry, in
// Unix seconds, while the connection's credentials expire):
//
//	unregister, err := otelamqp.RegisterStats(conn,
//		otelamqp.WithMeterProvider(mp),
//		otelamqp.WithAttributes(attribute.String("connection", "orders")))
//	...
//	defer unregister()
//
// Each count comes from one source: refreshes are counted by the
// Observer, which knows why one failed, and only the expiry, a state
// rather than an event, is read from Stats. An upstream-mode connection
// (with Config.SafeRecovery) refreshes too but calls no Observer: it
// reports the expiry and no count.
//
// # Cost
//
// The hooks run on the publisher's goroutine and on the read path's: a
// span costs what the SDK makes it cost, and the instrumentation adds
// little to it (attribute sets are computed once per destination and
// cached, the counters of confirms and acknowledgements allocate
// nothing). cmd/overhead measures it against a connection with no
// Observer and one whose funcs do nothing.
package otelamqp
