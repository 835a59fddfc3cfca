// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

// Endpoint lists: a connection that knows several URLs of one cluster
// recovers onto the next of them rather than redialling the URL it was
// first dialled with. The hooks in Reconnect
// (0002-recovery-endpoints.patch) are recoveryEndpoint and
// endpointCredentials; with Config.Endpoints nil both reduce to upstream's
// statements.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand"
	"net/url"
	"reflect"
	"sync"
)

// EndpointOrder is the order in which an Endpoints list hands out its
// endpoints. Every order tries each endpoint once per pass; they differ in
// where a pass starts.
type EndpointOrder int

const (
	// InOrder starts every pass at the first endpoint: the list is a
	// preference order (primary first, then the fallbacks).
	InOrder EndpointOrder = iota
	// RoundRobin starts a pass after the endpoint handed out last, so
	// successive recoveries, and connections sharing one list, spread
	// over the cluster.
	RoundRobin
	// Shuffle draws a new random permutation of the endpoints for every
	// pass.
	Shuffle
)

// String returns "in-order", "round-robin" or "shuffle".
func (o EndpointOrder) String() string {
	switch o {
	case InOrder:
		return "in-order"
	case RoundRobin:
		return "round-robin"
	case Shuffle:
		return "shuffle"
	}
	return fmt.Sprintf("EndpointOrder(%d)", int(o))
}

// Endpoint is one address of a cluster: an AMQP URI and the TLS
// configuration to use when its scheme is amqps.
type Endpoint struct {
	// URL is an AMQP URI, as Dial takes (amqp:// or amqps://).
	URL string
	// TLS is used for this endpoint's TLS handshake when URL is amqps.
	// Nil means the configuration upstream's DialConfig derives from the
	// URI (its cacertfile, certfile, keyfile and server_name_indication
	// parameters, or the system roots). An empty ServerName is set to the
	// URI's host. Ignored for amqp:// URLs.
	TLS *tls.Config
}

// ErrNoEndpoints is returned by NewEndpoints for an empty list.
var ErrNoEndpoints = errors.New("amqp091: an endpoint list needs at least one endpoint")

// Endpoints is an ordered list of a cluster's endpoints that a Connection
// recovers onto: when Config.Endpoints is set and automatic recovery
// (Config.Recovery) is enabled, each attempt of Connection.Reconnect dials
// the next endpoint of the list, with that endpoint's own TLS
// configuration, instead of the URL the connection was dialled with. A
// recovery starts a new pass (Reset, EndpointOrder); upstream's backoff
// between attempts (ReconnectionConfig.RetryInterval plus up to 500 ms of
// jitter) and its MaxRetryCount apply unchanged.
//
// Credentials: when the connection's SASL came from its URL (the caller
// configured no Config.SASL, or exactly the URL's), a recovery
// authenticates with the credentials of the URL of the endpoint it dials;
// SASL the caller configured is restored as upstream restores it. Either
// gives way to Config.Credentials, and with safe recovery the secret of the
// last UpdateSecret replaces the password (credentials.go). The
// vhost, heartbeat and channel_max are the connection's Config, fixed at
// the first dial, so every endpoint must name the same vhost.
//
// An Endpoints is safe for concurrent use. Connections that share one
// list share its position.
type Endpoints struct {
	order EndpointOrder
	eps   []endpoint

	mu   sync.Mutex
	perm []int           // the current pass; perm[pos:] is still to come
	pos  int             // len(perm) before the first call: a pass starts
	last int             // the index handed out last, -1 before any
	rand func(int) []int // rand.Perm; tests replace it
}

// endpoint is an Endpoint parsed and resolved once, by NewEndpoints.
type endpoint struct {
	Endpoint
	uri URI
	tls *tls.Config // the handshake's configuration (amqps only): own ServerName, never the caller's pointer
}

// NewEndpoints validates a list of endpoints and returns it with the given
// order. Every URL must parse (ParseURI), its amqps TLS configuration
// must be buildable (a cacertfile, certfile or keyfile that cannot be read
// is an error now, not at recovery), and all must name the same vhost,
// since the connection keeps one. The TLS configurations are copied: a
// later change to one is not seen.
func NewEndpoints(order EndpointOrder, endpoints ...Endpoint) (*Endpoints, error) {
	if order < InOrder || order > Shuffle {
		return nil, fmt.Errorf("amqp091: unknown endpoint order %v", order)
	}
	if len(endpoints) == 0 {
		return nil, ErrNoEndpoints
	}
	e := &Endpoints{order: order, eps: make([]endpoint, len(endpoints)), last: -1, rand: rand.Perm}
	for i, ep := range endpoints {
		uri, err := ParseURI(ep.URL)
		if err != nil {
			return nil, fmt.Errorf("amqp091: endpoint %d (%s): %w", i, redactURL(ep.URL), err)
		}
		if i > 0 && uri.Vhost != e.eps[0].uri.Vhost {
			return nil, fmt.Errorf("amqp091: endpoint %d (%s) names vhost %q, endpoint 0 names %q: the endpoints of a list share one vhost",
				i, redactURL(ep.URL), uri.Vhost, e.eps[0].uri.Vhost)
		}
		var tc *tls.Config
		if uri.Scheme == "amqps" {
			if ep.TLS != nil {
				tc = ep.TLS.Clone()
			} else if tc, err = tlsConfigFromURI(uri); err != nil {
				return nil, fmt.Errorf("amqp091: endpoint %d (%s): create TLS config from URI: %w", i, redactURL(ep.URL), err)
			}
			if tc.ServerName == "" {
				tc.ServerName = uri.Host
			}
		}
		e.eps[i] = endpoint{Endpoint: ep, uri: uri, tls: tc}
	}
	e.pos = len(e.eps)
	return e, nil
}

// Order returns the list's order.
func (e *Endpoints) Order() EndpointOrder { return e.order }

// Len returns the number of endpoints.
func (e *Endpoints) Len() int { return len(e.eps) }

// All returns the endpoints in the order they were given.
func (e *Endpoints) All() []Endpoint {
	all := make([]Endpoint, len(e.eps))
	for i, ep := range e.eps {
		all[i] = ep.Endpoint
	}
	return all
}

// Next returns the next endpoint of the current pass, as it was given to
// NewEndpoints (its TLS is the caller's pointer). When a pass is over,
// the next one starts: InOrder at the first endpoint, RoundRobin after the
// endpoint returned last, Shuffle with a new permutation. So n calls in a
// row return each of n endpoints once, and calls go on cycling for ever.
func (e *Endpoints) Next() Endpoint { return e.next().Endpoint }

// Reset ends the current pass: the next call to Next starts a new one.
// Every recovery calls it before its first attempt.
func (e *Endpoints) Reset() {
	e.mu.Lock()
	e.pos = len(e.eps)
	e.mu.Unlock()
}

// next is Next, returning the parsed endpoint.
func (e *Endpoints) next() *endpoint {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.eps)
	if e.pos >= n {
		switch e.order {
		case Shuffle:
			e.perm = e.rand(n)
		default:
			start := 0
			if e.order == RoundRobin {
				start = e.last + 1
			}
			if e.perm == nil {
				e.perm = make([]int, n)
			}
			for i := range e.perm {
				e.perm[i] = (start + i) % n
			}
		}
		e.pos = 0
	}
	i := e.perm[e.pos]
	e.pos++
	e.last = i
	return &e.eps[i]
}

// recoveryEndpoint is Reconnect's hook for the address of attempt (0 for
// the first attempt of a recovery): without an endpoint list it is
// upstream's ParseURI(c.url) and Config.TLSClientConfig; with one, the
// first attempt starts a new pass and every attempt takes the list's next
// endpoint, with its own TLS configuration.
func (c *Connection) recoveryEndpoint(attempt int) (URI, *tls.Config, error) {
	eps := c.Config.Endpoints
	if eps == nil {
		uri, err := ParseURI(c.url)
		return uri, c.Config.TLSClientConfig, err
	}
	if attempt == 0 {
		eps.Reset()
	}
	ep := eps.next()
	Logger.Printf("Connection recovery dials endpoint %s (%s)", redactURL(ep.URL), eps.order)
	return ep.uri, ep.tls, nil
}

// endpointCredentials is Reconnect's hook for SASL: with an endpoint list,
// and a connection whose SASL is what upstream's setSASL derives from the
// URL it was dialled with (the caller configured none, or the very same),
// a recovery takes the credentials of the URL of the endpoint it dials
// rather than restoring the first URL's. Without a list it is false, and
// upstream restores the SASL captured at Open.
func (c *Connection) endpointCredentials() bool {
	if c.Config.Endpoints == nil {
		return false
	}
	uri, err := ParseURI(c.url)
	if err != nil {
		return false
	}
	var fromURL Config
	if err := fromURL.setSASL(uri); err != nil {
		return false
	}
	return reflect.DeepEqual(fromURL.SASL, c.originalSASL)
}

// redactURL is s with its password hidden, for logs and errors.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "an unparsable URL"
	}
	return u.Redacted()
}
