package compat

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/backoff"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The defaults of DialCluster's options.
const (
	DefaultBackoffInitial = 100 * time.Millisecond // WithBackoff's initial delay
	DefaultBackoffMax     = 5 * time.Second        // WithBackoff's cap
	DefaultAttemptTimeout = 10 * time.Second       // WithAttemptTimeout
)

// DialFunc opens a network connection, honouring ctx, as
// net.Dialer.DialContext does.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// cluster holds DialCluster's options.
type cluster struct {
	order          amqp.EndpointOrder
	tls            map[string]*tls.Config
	config         amqp.Config
	backoffInitial time.Duration
	backoffMax     time.Duration
	maxAttempts    int
	attemptTimeout time.Duration
	dial           DialFunc
	logger         *slog.Logger
}

// WithOrder sets the order in which DialCluster tries the URLs, and in
// which the connection's automatic recovery tries them afterwards:
// amqp.InOrder (the default: the first URL is preferred), amqp.RoundRobin
// or amqp.Shuffle. Other Dial functions ignore it.
func WithOrder(order amqp.EndpointOrder) Option {
	return func(o *options) { o.cluster.order = order }
}

// WithEndpointTLS gives the endpoint url (one of DialCluster's urls,
// spelled the same) its own TLS configuration, for an amqps URL. An amqps
// URL without one uses WithConfig's TLSClientConfig, and without that the
// configuration upstream derives from the URL. An empty ServerName is the
// URL's host. Other Dial functions ignore it.
func WithEndpointTLS(url string, cfg *tls.Config) Option {
	return func(o *options) {
		if o.cluster.tls == nil {
			o.cluster.tls = make(map[string]*tls.Config)
		}
		o.cluster.tls[url] = cfg
	}
}

// WithConfig is DialCluster's base amqp.Config, honoured as
// amqp.DialConfig honours it (Recovery included), except for ReadPath
// (the mode's), Endpoints (DialCluster's list) and Dial, which must be
// nil: give a dialer with WithDialer. Other Dial functions ignore it.
func WithConfig(cfg amqp.Config) Option {
	return func(o *options) { o.cluster.config = cfg }
}

// WithBackoff sets DialCluster's delay between passes over the list: after
// the n-th pass in which every endpoint failed, it waits a random time
// between 0 and min(max, initial·2^(n-1)) ("full jitter") before the next
// pass. Within a pass the endpoints are tried one after another without
// delay. Defaults: DefaultBackoffInitial, DefaultBackoffMax. Other Dial
// functions ignore it.
func WithBackoff(initial, max time.Duration) Option {
	return func(o *options) { o.cluster.backoffInitial, o.cluster.backoffMax = initial, max }
}

// WithMaxAttempts bounds the number of endpoints DialCluster dials in all
// (an attempt is one endpoint); 0, the default, keeps trying until ctx
// ends. Other Dial functions ignore it.
func WithMaxAttempts(n int) Option {
	return func(o *options) { o.cluster.maxAttempts = n }
}

// WithAttemptTimeout bounds one attempt: TCP connect, TLS handshake and
// AMQP handshake together (default DefaultAttemptTimeout), so an endpoint
// that accepts and never answers costs at most this much before the next
// is tried. It is also the bound of each dial of the connection's
// automatic recovery. Other Dial functions ignore it.
func WithAttemptTimeout(d time.Duration) Option {
	return func(o *options) { o.cluster.attemptTimeout = d }
}

// WithDialer makes DialCluster, DialContext, DialTLSContext and
// DialConfigContext, and the automatic recovery of their connections, open
// TCP connections with dial instead of a net.Dialer; for example one that
// dials from another network namespace or through a proxy. dial must
// honour its ctx. Other Dial functions ignore it.
func WithDialer(dial DialFunc) Option {
	return func(o *options) { o.cluster.dial = dial }
}

// WithLogger makes DialCluster log each failed attempt at Debug, and each
// pass in which every endpoint failed at Warn, to logger (nil, the
// default: nothing is logged). Other Dial functions ignore it.
func WithLogger(logger *slog.Logger) Option {
	return func(o *options) { o.cluster.logger = logger }
}

// DialCluster dials the first of urls, a cluster's endpoints, that
// completes the AMQP handshake, in the given read mode, and sets the
// connection's Config.Endpoints to the same list so that its automatic
// recovery (WithConfig's Recovery) moves on to the next endpoint when the
// node it is on goes away (see amqp.Endpoints).
//
// Each pass tries every endpoint once, in the order of WithOrder, without
// delay between endpoints: an endpoint that refuses costs one refused
// connect, one that accepts and never answers at most WithAttemptTimeout.
// When a whole pass failed, DialCluster backs off (WithBackoff: full
// jitter, exponential per pass) and starts the next pass, as kombu's
// failover and the Java client's address list do. It gives up after
// WithMaxAttempts endpoints, or when ctx ends.
//
// ctx bounds the whole dial, TCP connect, TLS handshake and AMQP handshake
// included: when it ends, DialCluster returns promptly with an error that
// wraps ctx.Err() and the last attempt's error, and leaves no connection
// or goroutine behind. ctx does not bound the returned connection, nor its
// recovery.
//
// With RoundRobin, the connection's recovery starts after the endpoint
// DialCluster connected to; with InOrder, at the first URL; with Shuffle,
// at a random one. RemoteAddr tells which endpoint a connection is on.
func DialCluster(ctx context.Context, urls []string, mode Mode, opts ...Option) (*amqp.Connection, error) {
	o := options{cluster: cluster{
		backoffInitial: DefaultBackoffInitial,
		backoffMax:     DefaultBackoffMax,
		attemptTimeout: DefaultAttemptTimeout,
	}}
	for _, opt := range opts {
		opt(&o)
	}
	cl := o.cluster
	rp, err := ReadPath(mode, opts...)
	if err != nil {
		return nil, err
	}
	list, err := cl.endpoints(urls)
	if err != nil {
		return nil, err
	}
	if cl.dial == nil {
		cl.dial = (&net.Dialer{}).DialContext
	}
	if o.blocking {
		cl.dial = blockingDial(cl.dial, cl.attemptTimeout)
	}
	return cl.passes(ctx, rp, list)
}

// endpoints checks the options and builds the endpoint list of urls, each
// with its TLS configuration.
func (cl *cluster) endpoints(urls []string) (*amqp.Endpoints, error) {
	if cl.config.Dial != nil {
		return nil, errors.New("compat: DialCluster: give the dialer with WithDialer (it takes a context), not Config.Dial")
	}
	if cl.backoffInitial < 0 || cl.backoffMax < 0 || cl.attemptTimeout <= 0 || cl.maxAttempts < 0 {
		return nil, fmt.Errorf("compat: DialCluster: invalid options: backoff %v..%v, attempt timeout %v, max attempts %d",
			cl.backoffInitial, cl.backoffMax, cl.attemptTimeout, cl.maxAttempts)
	}
	eps := make([]amqp.Endpoint, len(urls))
	for i, u := range urls {
		tc, ok := cl.tls[u]
		if !ok {
			tc = cl.config.TLSClientConfig
		}
		eps[i] = amqp.Endpoint{URL: u, TLS: tc}
	}
	for u := range cl.tls {
		if !contains(urls, u) {
			return nil, fmt.Errorf("compat: DialCluster: WithEndpointTLS names %s, which is not one of the urls", redact(u))
		}
	}
	list, err := amqp.NewEndpoints(cl.order, eps...)
	if err != nil {
		return nil, fmt.Errorf("compat: DialCluster: %w", err)
	}
	return list, nil
}

// passes dials the endpoints of list one after another, backing off after
// each pass in which all failed, until one answers, WithMaxAttempts
// attempts failed, or ctx ends.
func (cl *cluster) passes(ctx context.Context, rp amqp.ReadPath, list *amqp.Endpoints) (*amqp.Connection, error) {
	bo := cl.passBackoff()
	var last error
	for attempt := 0; cl.maxAttempts == 0 || attempt < cl.maxAttempts; attempt++ {
		if attempt > 0 && attempt%list.Len() == 0 {
			delay := bo.Delay(attempt / list.Len())
			cl.log(slog.LevelWarn, "every endpoint failed; backing off", "endpoints", list.Len(), "backoff", delay, "err", last)
			if err := sleep(ctx, delay); err != nil {
				return nil, ended(err, last)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, ended(err, last)
		}
		ep := list.Next()
		conn, err := cl.attempt(ctx, ep, rp, list)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ended(ctx.Err(), err)
		}
		last = fmt.Errorf("%s: %w", redact(ep.URL), err)
		cl.log(slog.LevelDebug, "attempt failed", "endpoint", redact(ep.URL), "attempt", attempt+1, "err", err)
	}
	return nil, fmt.Errorf("compat: DialCluster: %d attempts failed, the last: %w", cl.maxAttempts, last)
}

// passBackoff is DialCluster's backoff between passes (see WithBackoff):
// full jitter over an exponential bound; its Delay(n) follows the n-th
// failed pass.
func (cl *cluster) passBackoff() backoff.Exponential {
	return backoff.Exponential{Initial: cl.backoffInitial, Max: cl.backoffMax, Jitter: backoff.Full}
}

// ended is DialCluster's error when its ctx ended.
func ended(ctxErr, last error) error {
	if last == nil {
		return fmt.Errorf("compat: DialCluster: %w before any endpoint answered", ctxErr)
	}
	return fmt.Errorf("compat: DialCluster: %w; last attempt: %w", ctxErr, last)
}

// attempt dials one endpoint, bounded by ctx and the attempt timeout.
func (cl *cluster) attempt(ctx context.Context, ep amqp.Endpoint, rp amqp.ReadPath, list *amqp.Endpoints) (*amqp.Connection, error) {
	actx, cancel := context.WithTimeout(ctx, cl.attemptTimeout)
	defer cancel()

	cfg := cl.config
	cfg.ReadPath = rp
	cfg.Endpoints = list
	cfg.TLSClientConfig = ep.TLS.Clone() // DialConfig sets an empty ServerName on it
	cfg.Properties = maps.Clone(cfg.Properties)
	conn, err := handshake(actx, ep.URL, cfg, cl.dial, cl.attemptTimeout)
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("not connected within %v: %w", cl.attemptTimeout, err)
		}
		return nil, err
	}
	return conn, nil
}

// handshake is amqp.DialConfig(url, cfg) with cfg.Dial replaced by a
// phaseDialer over dial: ctx bounds the TCP connect, the TLS handshake and
// the AMQP handshake, and the connection's recoveries dial with
// recoveryTimeout. It is the one place where DialCluster (per attempt) and
// DialContext open a connection, so that both bound it the same way.
//
// On error nothing is left open: neither the connection, nor its socket,
// nor a goroutine of the phaseDialer. The error is DialConfig's, or
// ctx.Err() when ctx ended after DialConfig succeeded but before the
// phaseDialer let go of the socket.
func handshake(ctx context.Context, url string, cfg amqp.Config, dial DialFunc, recoveryTimeout time.Duration) (*amqp.Connection, error) {
	d := &phaseDialer{dial: dial, timeout: recoveryTimeout, ctx: ctx}
	cfg.Dial = d.Dial
	conn, err := amqp.DialConfig(url, cfg)
	if interrupted := d.handshakeDone(); interrupted || err != nil {
		if conn != nil && err == nil {
			_ = conn.Close()
		}
		d.closeSocket() // whatever upstream left of a failed handshake
		return nil, errOr(err, ctx.Err())
	}
	return conn, nil
}

func errOr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// phaseDialer is the Config.Dial of a connection dialled by DialCluster or
// DialContext (see handshake). During the first dial it dials with the
// attempt's ctx, sets the socket's deadline to the ctx's, and closes the
// socket if ctx ends before the handshake is over; afterwards, for the
// connection's recovery, it dials with its own timeout and sets the
// handshake deadline as upstream's DefaultDial does (openComplete clears
// it).
type phaseDialer struct {
	dial    DialFunc
	timeout time.Duration

	mu   sync.Mutex
	ctx  context.Context // the first dial's; nil once it is over
	conn net.Conn        // the first dial's socket
	stop func() bool     // stops the close of conn at ctx's end
}

func (d *phaseDialer) Dial(network, addr string) (net.Conn, error) {
	d.mu.Lock()
	ctx := d.ctx
	d.mu.Unlock()
	if ctx == nil { // a recovery
		ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
		defer cancel()
		conn, err := d.dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := conn.SetDeadline(time.Now().Add(d.timeout)); err != nil {
			conn.Close()
			return nil, err
		}
		return conn, nil
	}
	conn, err := d.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			conn.Close()
			return nil, err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil { // cannot happen: DialConfig dials once
		conn.Close()
		return nil, errors.New("compat: dial after the handshake")
	}
	d.conn = conn
	d.stop = context.AfterFunc(ctx, func() { conn.Close() })
	return conn, nil
}

// handshakeDone ends the first dial: later dials are recoveries. It
// reports whether ctx ended, and closed the socket, before the end, and
// closes the socket of a failed dial.
func (d *phaseDialer) handshakeDone() (interrupted bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ctx = nil
	if d.stop != nil && !d.stop() {
		interrupted = true
	}
	return interrupted
}

// closeSocket closes the first dial's socket, if there was one.
func (d *phaseDialer) closeSocket() {
	d.mu.Lock()
	conn := d.conn
	d.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (cl *cluster) log(level slog.Level, msg string, args ...any) {
	if cl.logger != nil {
		cl.logger.Log(context.Background(), level, "compat: DialCluster: "+msg, args...)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// redact hides the password of an AMQP URL.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "an unparsable URL"
	}
	return u.Redacted()
}

// Endpoint returns the address (host:port) of the node conn is connected
// to, which changes when its recovery moves it to another endpoint: the
// string form of conn.RemoteAddr().
func Endpoint(conn *amqp.Connection) string {
	return conn.RemoteAddr().String()
}
