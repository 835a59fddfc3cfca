package otelamqp

import (
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Operation names (messaging.operation.name). RabbitMQ's own vocabulary
// where it has one: basic.publish is "publish"; the consumer side keeps
// the generic "receive" and "process", since basic.deliver and basic.get
// both end up as a Delivery and the observer cannot tell which handed it
// over.
const (
	opPublish = "publish"
	opReceive = "receive"
	opProcess = "process"
)

// op says which side of a message a destination is described for: the
// semantic conventions name the producer and the consumer destinations
// differently.
type op uint8

const (
	opKindPublish op = iota
	opKindReceive
	opKindProcess
	opKindReturn
)

func (o op) name() string {
	switch o {
	case opKindReceive:
		return opReceive
	case opKindProcess:
		return opProcess
	}
	return opPublish
}

func (o op) typ() attribute.KeyValue {
	switch o {
	case opKindReceive:
		return semconv.MessagingOperationTypeReceive
	case opKindProcess:
		return semconv.MessagingOperationTypeProcess
	}
	return semconv.MessagingOperationTypeSend
}

// destination is everything derived from one (exchange, routing key) pair
// for one operation: computed once and cached, because string
// concatenation and attribute sets allocate, and the publish path should
// not pay for them on every message to the same place.
type destination struct {
	// name is messaging.destination.name. The RabbitMQ conventions build
	// it from the parts that are present and non-empty, joined by ":":
	// "{exchange}:{routing key}" (the consumer side would append the
	// queue, which a Delivery does not carry).
	name string
	// spanName is "{operation} {target}", target being the exchange, or
	// for the default exchange the routing key (the queue's name), unless
	// that is server-named: a span name must have low cardinality, and
	// "amq.gen-..." names are new for every queue.
	spanName string
	// anonymous: the default exchange and a server-named queue.
	anonymous bool

	// count are the attributes of the message counters (sent,
	// consumed, returned): messaging.system, messaging.operation.name,
	// the destination (omitted when anonymous, as it is new for every
	// queue: messaging.destination.anonymous says so instead), the server
	// and the user's attributes. duration adds messaging.operation.type
	// for the duration histograms.
	count    measureSet
	duration measureSet
}

// serverNamedPrefix starts every queue name the broker generates for a
// queue.declare with an empty name.
const serverNamedPrefix = "amq.gen-"

func newDestination(o op, exchange, routingKey string, base []attribute.KeyValue) *destination {
	d := &destination{}
	switch {
	case exchange != "" && routingKey != "":
		d.name = exchange + ":" + routingKey
	case exchange != "":
		d.name = exchange
	default:
		d.name = routingKey
	}
	d.anonymous = exchange == "" && strings.HasPrefix(routingKey, serverNamedPrefix)
	target := exchange
	if target == "" && !d.anonymous {
		target = routingKey
	}
	d.spanName = o.name()
	if target != "" {
		d.spanName += " " + target
	}

	attrs := make([]attribute.KeyValue, 0, len(base)+4)
	attrs = append(attrs, base...)
	attrs = append(attrs, semconv.MessagingOperationName(o.name()))
	switch {
	case d.anonymous:
		attrs = append(attrs, semconv.MessagingDestinationAnonymous(true))
	case d.name != "":
		attrs = append(attrs, semconv.MessagingDestinationName(d.name))
	}
	d.count = newMeasureSet(attribute.NewSet(attrs...))
	attrs = append(attrs, o.typ())
	d.duration = newMeasureSet(attribute.NewSet(attrs...))
	return d
}

// spanAttrs appends the destination's span attributes.
func (d *destination) spanAttrs(attrs []attribute.KeyValue, routingKey string) []attribute.KeyValue {
	if d.name != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(d.name))
	}
	if routingKey != "" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(routingKey))
	}
	if d.anonymous {
		// Not messaging.destination.temporary: a server-named queue may
		// well be durable, and the observer cannot tell.
		attrs = append(attrs, semconv.MessagingDestinationAnonymous(true))
	}
	return attrs
}

// measureSet is an attribute set with the options that record it, made
// once: wrapping a set in an option boxes it, an allocation on every call.
type measureSet struct {
	set    attribute.Set
	add    []metric.AddOption
	record []metric.RecordOption
}

func newMeasureSet(set attribute.Set) measureSet {
	opt := metric.WithAttributeSet(set)
	return measureSet{set: set, add: []metric.AddOption{opt}, record: []metric.RecordOption{opt}}
}

type destKey struct {
	op                   op
	exchange, routingKey string
}

// maxCachedDestinations bounds the cache: a topic exchange can see
// unboundedly many routing keys, and past the bound a destination is
// computed on every call rather than kept forever.
const maxCachedDestinations = 1024

// destCache maps (op, exchange, routing key) to its destination. A map
// under a RWMutex rather than a sync.Map: looking a struct key up in a
// sync.Map boxes it, an allocation per message.
type destCache struct {
	base []attribute.KeyValue
	mu   sync.RWMutex
	m    map[destKey]*destination
}

func (c *destCache) get(o op, exchange, routingKey string) *destination {
	k := destKey{o, exchange, routingKey}
	c.mu.RLock()
	d := c.m[k]
	c.mu.RUnlock()
	if d != nil {
		return d
	}
	d = newDestination(o, exchange, routingKey, c.base)
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[destKey]*destination)
	}
	if prev := c.m[k]; prev != nil {
		d = prev
	} else if len(c.m) < maxCachedDestinations {
		c.m[k] = d
	}
	c.mu.Unlock()
	return d
}
