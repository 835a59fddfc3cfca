// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

// Endpoint lists: a connection that knows several URLs of one cluster recovers onto the next
// of them. Reconnect's hooks (0002-recovery-endpoints.patch), recoveryEndpoint and
// endpointCredentials, run upstream's code when Config.Endpoints is nil.
//
// Everything that can fail (a URL that does not parse, an unreadable certificate file, a
// vhost that differs) fails in NewEndpoints, when the application builds the list, not at a
// recovery, where the error would only show as one more failed attempt.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand"
	"net/url"
	"reflect"
	"sync"
)

// EndpointOrder is the order in which an Endpoints list hands out its endpoints. Every order tries
// each endpoint once per pass; they differ in where a pass starts.
type EndpointOrder int

const (
	// InOrder starts every pass at the first endpoint: a preference order (primary, then fallbacks).
	InOrder EndpointOrder = iota
	// RoundRobin starts a pass after the endpoint handed out last: recoveries spread over the cluster.
	RoundRobin
	// Shuffle draws a new random permutation for every pass.
	Shuffle
)

// String returns "in-order", "round-robin" or "shuffle".
func (o EndpointOrder) String() string {
	if o < InOrder || o > Shuffle {
		return fmt.Sprintf("EndpointOrder(%d)", int(o))
	}
	return [...]string{"in-order", "round-robin", "shuffle"}[o]
}

// Endpoint is one address of a cluster: an AMQP URI, and the TLS configuration for amqps.
type Endpoint struct {
	// URL is an AMQP URI, as Dial takes (amqp:// or amqps://).
	URL string
	// TLS is the TLS configuration for an amqps URL (ignored for amqp://). Nil means the one
	// upstream's DialConfig derives from the URI (its cacertfile, certfile, keyfile and
	// server_name_indication parameters, or the system roots). An empty ServerName is the URI's host.
	TLS *tls.Config
}

// ErrNoEndpoints is returned by NewEndpoints for an empty list.
var ErrNoEndpoints = errors.New("amqp091: an endpoint list needs at least one endpoint")

// Endpoints is an ordered list of a cluster's endpoints that a Connection recovers onto: with
// Config.Endpoints set and automatic recovery (Config.Recovery) enabled, each attempt of
// Connection.Reconnect dials the list's next endpoint, with its TLS configuration, instead of the
// URL first dialled. A recovery starts a new pass (Reset); upstream's backoff and MaxRetryCount
// apply unchanged. When the connection's SASL came from its URL (no Config.SASL, or exactly the
// URL's), a recovery logs in with the credentials of the URL it dials; configured SASL is restored
// as upstream does. Config.Credentials overrides either, and with safe recovery the last
// UpdateSecret's secret replaces the password (credentials.go). The vhost, heartbeat and
// channel_max are fixed at the first dial, so all endpoints name one vhost. An Endpoints is safe
// for concurrent use; connections sharing one list share its position.
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
	// tls is the handshake's configuration (amqps only): a copy with its ServerName set, never
	// the caller's pointer, which the application may change or share.
	tls *tls.Config
}

// NewEndpoints validates a list of endpoints and returns it with the given order. Every URL must
// parse (ParseURI), an amqps TLS configuration must be buildable (an unreadable cacertfile,
// certfile or keyfile is an error now, not at recovery), and all must name the same vhost. The TLS
// configurations are copied: later changes to them are not seen.
func NewEndpoints(order EndpointOrder, endpoints ...Endpoint) (*Endpoints, error) {
	if order < InOrder || order > Shuffle {
		return nil, fmt.Errorf("amqp091: unknown endpoint order %v", order)
	}
	if len(endpoints) == 0 {
		return nil, ErrNoEndpoints
	}
	n := len(endpoints)
	e := &Endpoints{order: order, eps: make([]endpoint, n), perm: make([]int, n),
		pos: n, last: -1, rand: rand.Perm}
	for i, ep := range endpoints {
		uri, err := ParseURI(ep.URL)
		if err != nil {
			return nil, fmt.Errorf("amqp091: endpoint %d (%s): %w", i, redactURL(ep.URL), err)
		}
		if i > 0 && uri.Vhost != e.eps[0].uri.Vhost {
			return nil, fmt.Errorf("amqp091: endpoint %d (%s) names vhost %q, endpoint 0 names %q: "+
				"the endpoints of a list share one vhost", i, redactURL(ep.URL), uri.Vhost,
				e.eps[0].uri.Vhost)
		}
		// The handshake's TLS configuration, built now: the caller's copied (so later
		// changes are not seen), or upstream's from the URI, with the URI's host as the
		// server name when none is set, as upstream's DialConfig does.
		var tc *tls.Config
		if uri.Scheme == "amqps" {
			if ep.TLS != nil {
				tc = ep.TLS.Clone()
			} else if tc, err = tlsConfigFromURI(uri); err != nil {
				return nil, fmt.Errorf("amqp091: endpoint %d (%s): create TLS config from URI: %w",
					i, redactURL(ep.URL), err)
			}
			if tc.ServerName == "" {
				tc.ServerName = uri.Host
			}
		}
		e.eps[i] = endpoint{Endpoint: ep, uri: uri, tls: tc}
	}
	return e, nil
}

// Order returns the list's order.
func (e *Endpoints) Order() EndpointOrder { return e.order }

// Len returns the number of endpoints.
func (e *Endpoints) Len() int { return len(e.eps) }

// All returns the endpoints in the order they were given, in a new slice: changing it does
// not change the list.
func (e *Endpoints) All() []Endpoint {
	all := make([]Endpoint, len(e.eps))
	for i, ep := range e.eps {
		all[i] = ep.Endpoint
	}
	return all
}

// Next returns the next endpoint of the current pass, as given to NewEndpoints (its TLS is the
// caller's pointer). When a pass is over the next starts as the list's EndpointOrder says: so n
// calls in a row return each of n endpoints once, and calls cycle for ever.
func (e *Endpoints) Next() Endpoint { return e.next().Endpoint }

// Reset ends the current pass, so Next starts a new one; every recovery calls it first.
func (e *Endpoints) Reset() {
	e.mu.Lock()
	e.pos = len(e.eps)
	e.mu.Unlock()
}

// next is Next, returning the parsed endpoint. Under e.mu, since connections sharing the
// list may recover at once: each call takes one position, and a pass is built once.
func (e *Endpoints) next() *endpoint {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.eps)
	if e.pos >= n { // the pass is over (or Reset ended it): lay out the next one in perm
		if e.order == Shuffle {
			e.perm = e.rand(n)
		} else {
			// InOrder starts at the first endpoint; RoundRobin after the one handed out
			// last, so a Reset does not send every recovery back to the same endpoint.
			start := 0
			if e.order == RoundRobin {
				start = e.last + 1
			}
			for i := range e.perm {
				e.perm[i] = (start + i) % n
			}
		}
		e.pos = 0
	}
	e.last = e.perm[e.pos]
	e.pos++
	return &e.eps[e.last]
}

// recoveryEndpoint is Reconnect's hook for the address of attempt (0: a recovery's first):
// without a list, upstream's ParseURI(c.url) and Config.TLSClientConfig; with one, the first
// attempt starts a new pass and each takes the next endpoint, with its own TLS configuration.
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
	// One log line per attempt, with the URL's password hidden (redactURL).
	Logger.Printf("Connection recovery dials endpoint %s (%s)", redactURL(ep.URL), eps.order)
	return ep.uri, ep.tls, nil
}

// endpointCredentials is Reconnect's hook for SASL: true with a list when c's SASL is what
// upstream's setSASL derives from the URL first dialled (none configured, or the same), so that
// a recovery logs in with the dialled endpoint's URL; else upstream restores the SASL of Open.
func (c *Connection) endpointCredentials() bool {
	if c.Config.Endpoints == nil {
		return false
	}
	// What upstream's setSASL derives from the first URL, compared with the SASL that Open
	// was given (originalSASL): equal means it came from the URL, none of the application's.
	var fromURL Config
	uri, err := ParseURI(c.url)
	if err == nil {
		err = fromURL.setSASL(uri)
	}
	return err == nil && reflect.DeepEqual(fromURL.SASL, c.originalSASL)
}

// redactURL is s with its password hidden, for logs and errors.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "an unparsable URL"
	}
	return u.Redacted()
}
