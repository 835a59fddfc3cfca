package otelamqp

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Option configures NewObserver, RegisterStats, ContextFromDelivery and
// StartProcessSpan.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config is what the options set. It is resolved once, in NewObserver or
// RegisterStats, so that the hooks read plain fields on the fast paths.
type config struct {
	tp    trace.TracerProvider
	mp    metric.MeterProvider
	prop  propagation.TextMapPropagator
	attrs []attribute.KeyValue

	serverAddress string
	serverPort    int

	handledSpans bool
}

func newConfig(opts []Option) config {
	c := config{handledSpans: true}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	// The globals are delegating wrappers: taking them now still follows
	// an otel.SetTracerProvider (or meter provider, or propagator) that
	// the application calls later.
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.prop == nil {
		c.prop = otel.GetTextMapPropagator()
	}
	return c
}

func (c *config) tracer() trace.Tracer {
	return c.tp.Tracer(ScopeName,
		trace.WithInstrumentationVersion(Version()),
		trace.WithSchemaURL(semconv.SchemaURL))
}

func (c *config) meter() metric.Meter {
	return c.mp.Meter(ScopeName,
		metric.WithInstrumentationVersion(Version()),
		metric.WithSchemaURL(semconv.SchemaURL))
}

// WithTracerProvider sets the TracerProvider that creates the spans. The
// default is otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithMeterProvider sets the MeterProvider that creates the instruments.
// The default is otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithPropagators sets the propagator that injects the producer's trace
// context into the message headers and extracts it from deliveries. The
// default is otel.GetTextMapPropagator(), which propagates nothing until
// the application sets one (otel.SetTextMapPropagator with
// propagation.TraceContext{}, typically): without it consumer spans cannot
// link to their producers.
func WithPropagators(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// WithAttributes adds attributes to every span and to every metric data
// point the observer or RegisterStats records: a connection's name, say,
// so that the gauges of two connections sharing a MeterProvider stay
// apart. Keep them few and of low cardinality, as they multiply the
// metric series.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrs = append(c.attrs, attrs...) })
}

// WithServerAddress sets the server.address and server.port attributes of
// spans and metrics: the broker the connection was dialled to. The
// Observer is not told which broker its connection uses, so the
// instrumentation cannot find it out itself. A port of 0 leaves out
// server.port.
func WithServerAddress(host string, port int) Option {
	return optionFunc(func(c *config) {
		c.serverAddress = host
		c.serverPort = port
	})
}

// WithHandledSpans says whether the observer makes a "process" span when a
// ConsumeFunc handler returns (Observer.Handled). It does by default. Turn
// it off when the handler calls StartProcessSpan itself, so that each
// message gets one process span, not two.
func WithHandledSpans(enabled bool) Option {
	return optionFunc(func(c *config) { c.handledSpans = enabled })
}
