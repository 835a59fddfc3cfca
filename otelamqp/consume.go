package otelamqp

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

// ContextFromDelivery returns ctx with the span context the producer
// injected into d's headers, as a remote span context: start a span from
// it and that span is the producer's child. If d carries no trace context
// (an uninstrumented producer, no propagator), ctx is returned as it is.
//
// The options are NewObserver's; only WithPropagators matters here.
func ContextFromDelivery(ctx context.Context, d *amqp.Delivery, opts ...Option) context.Context {
	if d == nil || len(d.Headers) == 0 {
		return ctx
	}
	cfg := newConfig(opts)
	return cfg.prop.Extract(ctx, HeaderCarrier(d.Headers))
}

// StartProcessSpan starts the "process" span of d for the code that
// handles it, as the conventions describe: a CONSUMER span named
// "process <destination>" with the messaging attributes of d, child of
// the producer's span when d carries its context, and linked to it. The
// caller ends the span, and may use the returned context for the work the
// handling does.
//
// Use it with Channel.Consume's deliveries. A ConsumeFunc handler gets a
// process span from the Observer already (Observer.Handled), unless the
// Observer was made WithHandledSpans(false).
//
// The options are NewObserver's (WithTracerProvider, WithPropagators, ...);
// pass the same ones. Each call resolves them, so code that calls it for
// many messages can keep a ProcessSpanStarter instead.
func StartProcessSpan(ctx context.Context, d *amqp.Delivery, opts ...Option) (context.Context, trace.Span) {
	return NewProcessSpanStarter(opts...).Start(ctx, d)
}

// ProcessSpanStarter starts process spans with options resolved once; see
// StartProcessSpan.
type ProcessSpanStarter struct {
	o *observer
}

// NewProcessSpanStarter resolves opts for Start.
func NewProcessSpanStarter(opts ...Option) *ProcessSpanStarter {
	cfg := newConfig(opts)
	base := baseAttrs(&cfg)
	return &ProcessSpanStarter{o: &observer{
		tracer:   cfg.tracer(),
		prop:     cfg.prop,
		spanBase: base,
		dests:    destCache{base: base},
	}}
}

// Start starts the process span of d, as StartProcessSpan does.
func (s *ProcessSpanStarter) Start(ctx context.Context, d *amqp.Delivery) (context.Context, trace.Span) {
	return s.o.startProcess(ctx, d)
}
