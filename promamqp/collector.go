package promamqp

import (
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/prometheus/client_golang/prometheus"
)

// namespace prefixes every metric name, so that the client's series sort
// together and never collide with the broker's own rabbitmq_* series
// scraped into the same Prometheus.
const namespace = "amqp091"

// Option configures a Collector at New.
type Option func(*config)

type config struct {
	channelLabels     bool
	consumerTagLabels bool
	buckets           []float64
	constLabels       prometheus.Labels
}

// WithChannelLabels adds a "channel" label (the channel id) to the
// listener and consumer gauges read from Stats. It is off by default
// because channel ids are reused and unbounded over a connection's life:
// a service that opens a channel per request would create a series per
// request. Turn it on to find which channel holds the budget while
// debugging, not in a long-lived dashboard.
func WithChannelLabels() Option { return func(c *config) { c.channelLabels = true } }

// WithConsumerTagLabels adds a "consumer_tag" label to the consumer
// gauges read from Stats. It is off by default for the same reason as
// WithChannelLabels: generated consumer tags are unique per Consume call.
// Turn it on when the application names its consumers with a fixed set of
// tags. Consumers sharing a tag on different channels are summed unless
// WithChannelLabels is also given.
func WithConsumerTagLabels() Option { return func(c *config) { c.consumerTagLabels = true } }

// WithBuckets replaces DefaultBuckets, the upper bounds in seconds of
// every latency histogram (confirm latency, RPC, handler, budget pause).
// New panics if they are not positive and strictly increasing.
func WithBuckets(seconds ...float64) Option {
	return func(c *config) { c.buckets = append([]float64(nil), seconds...) }
}

// WithConstLabels adds labels with fixed values to every metric. Two
// Collectors registered with one registry need them to tell their series
// apart, since their metric names are the same.
func WithConstLabels(labels prometheus.Labels) Option {
	return func(c *config) {
		c.constLabels = make(prometheus.Labels, len(labels))
		for k, v := range labels {
			c.constLabels[k] = v
		}
	}
}

// Collector is a prometheus.Collector over the counters of the Observer
// it hands out and over the Stats of the connections it watches. The
// Observer's funcs only add to atomic counters; every prometheus.Metric
// is built in Collect, at scrape time, so the cost of the labels and of
// the exposition is paid once per scrape rather than once per message.
//
// A Collector is safe for concurrent use: the Observer's funcs, Watch,
// Unwatch and Collect may run at once.
type Collector struct {
	cfg     config
	buckets buckets
	obs     *amqp.Observer
	n       counters
	d       descs

	mu    sync.Mutex
	conns map[string]*amqp.Connection
}

// New returns a Collector with no watched connection. Register it with a
// prometheus.Registerer, pass Observer() to the read path's options, and
// Watch the connections.
func New(opts ...Option) *Collector {
	c := &Collector{conns: map[string]*amqp.Connection{}}
	c.cfg.buckets = DefaultBuckets
	for _, o := range opts {
		o(&c.cfg)
	}
	c.buckets = newBuckets(c.cfg.buckets)
	c.n.init(&c.buckets)
	c.d.init(&c.cfg)
	c.obs = c.newObserver()
	return c
}

// Observer returns the Observer that counts into this Collector; it is
// the same *amqp.Observer at every call. Set it as DrainerOptions.Observer
// or LegacyOptions.Observer. One Observer may serve several connections:
// its counters are then their sum, with no connection label, because the
// funcs are not told which connection called them. For per-connection
// counters use one Collector per connection and WithConstLabels.
//
// To run code of your own on the same events, copy the struct and wrap
// its funcs; do not modify the returned Observer, which connections may
// be calling already.
func (c *Collector) Observer() *amqp.Observer { return c.obs }

// Watch adds conn, whose Stats are read at every scrape and exposed with
// the label connection=name. Watching a name again replaces the
// connection it stood for, so a service that redials after a failure can
// Watch the new connection under the old name and keep its series. A
// watched connection stays watched after it is closed (its Stats still
// answer, frozen), until Unwatch.
//
// Watch panics if conn is nil: a nil connection would otherwise fail
// later, inside a scrape, far from the code that passed it.
func (c *Collector) Watch(name string, conn *amqp.Connection) {
	if conn == nil {
		panic("promamqp: Watch of a nil *amqp.Connection")
	}
	c.mu.Lock()
	c.conns[name] = conn
	c.mu.Unlock()
}

// Unwatch stops reading the connection watched as name; its series
// disappear from the next scrape. Unwatching a name that is not watched
// does nothing.
func (c *Collector) Unwatch(name string) {
	c.mu.Lock()
	delete(c.conns, name)
	c.mu.Unlock()
}

// Describe sends the descriptors of every metric the Collector can
// expose, so that a registry can check them once at Register.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.d.all() {
		ch <- d
	}
}

// Collect sends the Observer's counters and, for every watched
// connection, what its Stats say now.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.collectObserver(ch)

	// Stats is called outside the lock: it walks the connection's
	// channels, and Watch and Unwatch should not wait for that.
	type watched struct {
		name string
		conn *amqp.Connection
	}
	c.mu.Lock()
	list := make([]watched, 0, len(c.conns))
	for name, conn := range c.conns {
		list = append(list, watched{name, conn})
	}
	c.mu.Unlock()
	for _, w := range list {
		s := w.conn.Stats()
		c.collectStats(ch, w.name, &s)
	}
}

var _ prometheus.Collector = (*Collector)(nil)
