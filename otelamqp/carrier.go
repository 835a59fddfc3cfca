package otelamqp

import (
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier adapts an amqp.Table to propagation.TextMapCarrier, so that
// a propagator can read and write trace context in message headers.
//
// Set writes into the Table itself: use it on a Table you own. The
// observer never uses it on a caller's Publishing, which it copies first.
type HeaderCarrier amqp.Table

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the header's value as a string. Other clients send headers
// as AMQP long strings, which amqp091-go decodes as string, or as byte
// arrays ([]byte); any other type is not a text header and reads as "".
func (c HeaderCarrier) Get(key string) string {
	switch v := c[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Set sets the header to value.
func (c HeaderCarrier) Set(key, value string) {
	c[key] = value
}

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// copyOnWriteCarrier injects into a Publishing's headers without touching
// the caller's Table: the first Set replaces msg.Headers by a copy, and
// later Sets write into the copy. When the propagator writes nothing (no
// valid span context, no baggage) nothing is copied.
type copyOnWriteCarrier struct {
	msg    *amqp.Publishing
	copied bool
}

func (c *copyOnWriteCarrier) Get(key string) string {
	return HeaderCarrier(c.msg.Headers).Get(key)
}

func (c *copyOnWriteCarrier) Set(key, value string) {
	if !c.copied {
		// Room for traceparent and tracestate (and baggage) without a
		// regrowth.
		t := make(amqp.Table, len(c.msg.Headers)+3)
		for k, v := range c.msg.Headers {
			t[k] = v
		}
		c.msg.Headers = t
		c.copied = true
	}
	c.msg.Headers[key] = value
}

func (c *copyOnWriteCarrier) Keys() []string {
	return HeaderCarrier(c.msg.Headers).Keys()
}
