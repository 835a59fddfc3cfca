package amqp091

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func mustEndpoints(t *testing.T, order EndpointOrder, urls ...string) *Endpoints {
	t.Helper()
	eps := make([]Endpoint, len(urls))
	for i, u := range urls {
		eps[i] = Endpoint{URL: u}
	}
	e, err := NewEndpoints(order, eps...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// hosts returns the hosts of n calls to Next.
func hosts(e *Endpoints, n int) string {
	var hs []string
	for i := 0; i < n; i++ {
		hs = append(hs, e.next().uri.Host)
	}
	return strings.Join(hs, " ")
}

func TestEndpointsInOrder(t *testing.T) {
	e := mustEndpoints(t, InOrder, "amqp://a/", "amqp://b/", "amqp://c/")
	if got := hosts(e, 5); got != "a b c a b" {
		t.Fatalf("InOrder: %s", got)
	}
	e.Reset()
	if got := hosts(e, 2); got != "a b" {
		t.Fatalf("InOrder after Reset: %s, want a pass from the first", got)
	}
}

func TestEndpointsRoundRobin(t *testing.T) {
	e := mustEndpoints(t, RoundRobin, "amqp://a/", "amqp://b/", "amqp://c/")
	if got := hosts(e, 2); got != "a b" {
		t.Fatalf("RoundRobin: %s", got)
	}
	e.Reset()
	if got := hosts(e, 4); got != "c a b c" {
		t.Fatalf("RoundRobin after Reset: %s, want to continue after the last one", got)
	}
}

func TestEndpointsShuffle(t *testing.T) {
	e := mustEndpoints(t, Shuffle, "amqp://a/", "amqp://b/", "amqp://c/")
	draws := 0
	perms := [][]int{{2, 0, 1}, {1, 2, 0}, {0, 2, 1}}
	e.rand = func(n int) []int { p := perms[draws%len(perms)]; draws++; return append([]int(nil), p...) }
	if got := hosts(e, 4); got != "c a b b" || draws != 2 {
		t.Fatalf("Shuffle: %s after %d draws", got, draws)
	}
	e.Reset()
	if got := hosts(e, 1); got != "a" || draws != 3 {
		t.Fatalf("Shuffle after Reset: %s after %d draws, want a new permutation", got, draws)
	}
	// With the real generator, every pass is a permutation.
	e = mustEndpoints(t, Shuffle, "amqp://a/", "amqp://b/", "amqp://c/", "amqp://d/")
	for pass := 0; pass < 50; pass++ {
		seen := map[string]bool{}
		for i := 0; i < 4; i++ {
			seen[e.Next().URL] = true
		}
		if len(seen) != 4 {
			t.Fatalf("pass %d handed out %v, want each endpoint once", pass, seen)
		}
	}
}

// TestEndpointsConcurrent: under -race, Next and Reset from many
// goroutines; round-robin without Reset hands each endpoint out equally.
func TestEndpointsConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := mustEndpoints(t, RoundRobin, "amqp://a/", "amqp://b/", "amqp://c/", "amqp://d/")
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[string]int{}
			for i := 0; i < 1000; i++ {
				local[e.Next().URL]++
			}
			mu.Lock()
			for k, v := range local {
				count[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, ep := range e.All() {
		if count[ep.URL] != 2000 {
			t.Fatalf("round robin over 8000 calls: %v, want 2000 each", count)
		}
	}
	s := mustEndpoints(t, Shuffle, "amqp://a/", "amqp://b/")
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				s.Next()
				s.Reset()
			}
		}()
	}
	wg.Wait()
}

func TestNewEndpointsErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order EndpointOrder
		eps   []Endpoint
		want  string
	}{
		{"empty", InOrder, nil, "at least one endpoint"},
		{"bad scheme", InOrder, []Endpoint{{URL: "amqp://a/"}, {URL: "http://u:secret@b/"}}, "endpoint 1 (http://u:xxxxx@b/)"},
		{"bad port", RoundRobin, []Endpoint{{URL: "amqp://a:notaport/"}}, "endpoint 0"},
		{"vhosts differ", InOrder, []Endpoint{{URL: "amqp://a/one"}, {URL: "amqp://b/two"}}, `names vhost "two", endpoint 0 names "one"`},
		{"unreadable CA", InOrder, []Endpoint{{URL: "amqps://a/?cacertfile=/nonexistent/ca.pem"}}, "create TLS config from URI"},
		{"unknown order", EndpointOrder(7), []Endpoint{{URL: "amqp://a/"}}, "unknown endpoint order EndpointOrder(7)"},
	} {
		_, err := NewEndpoints(tc.order, tc.eps...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewEndpoints = %v, want an error containing %q", tc.name, err, tc.want)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error shows a password: %v", tc.name, err)
		}
	}
	if _, err := NewEndpoints(InOrder); !errors.Is(err, ErrNoEndpoints) {
		t.Errorf("no endpoints: %v, want ErrNoEndpoints", err)
	}
}

// TestEndpointsTLS: Next returns the endpoint's own TLS config; recovery
// uses a copy of it with the endpoint's host as ServerName when it has
// none, upstream's config from the URI when the endpoint gives none, and
// nothing for amqp://.
func TestEndpointsTLS(t *testing.T) {
	roots := x509.NewCertPool()
	own := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}
	named := &tls.Config{ServerName: "cluster.example"}
	e, err := NewEndpoints(InOrder,
		Endpoint{URL: "amqps://node1:5671/", TLS: own},
		Endpoint{URL: "amqps://node2:5671/", TLS: named},
		Endpoint{URL: "amqps://node3:5671/"},
		Endpoint{URL: "amqp://node4/", TLS: own})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Next(); got.TLS != own {
		t.Fatalf("Next().TLS = %p, want the endpoint's own %p", got.TLS, own)
	}
	if own.ServerName != "" {
		t.Fatal("NewEndpoints changed the caller's tls.Config")
	}
	c := &Connection{Config: Config{Endpoints: e, TLSClientConfig: &tls.Config{ServerName: "not-this-one"}}}
	want := []struct {
		host, serverName string
		roots            *x509.CertPool
		tls              bool
	}{{"node1", "node1", roots, true}, {"node2", "cluster.example", nil, true}, {"node3", "node3", nil, true}, {"node4", "", nil, false}}
	for i, w := range want {
		uri, tc, err := c.recoveryEndpoint(i)
		if err != nil {
			t.Fatal(err)
		}
		if uri.Host != w.host || (tc != nil) != w.tls {
			t.Fatalf("attempt %d: %s, TLS %v; want %s, TLS %v", i, uri.Host, tc, w.host, w.tls)
		}
		if tc == nil {
			continue
		}
		if tc == own || tc == named || tc.ServerName != w.serverName {
			t.Fatalf("attempt %d: TLS %p ServerName %q; want a copy with %q", i, tc, tc.ServerName, w.serverName)
		}
		if w.roots != nil && (tc.RootCAs != w.roots || tc.MinVersion != tls.VersionTLS13) {
			t.Fatalf("attempt %d: the endpoint's own settings were lost", i)
		}
		if i == 2 && tc.RootCAs == nil {
			t.Fatal("an endpoint without TLS did not get upstream's config from its URI (system roots)")
		}
	}
}

// TestRecoveryEndpointWithoutList: the hook is upstream's statements.
func TestRecoveryEndpointWithoutList(t *testing.T) {
	tc := &tls.Config{}
	c := &Connection{url: "amqps://u:p@h:1234/v", Config: Config{TLSClientConfig: tc}}
	for attempt := 0; attempt < 2; attempt++ {
		uri, got, err := c.recoveryEndpoint(attempt)
		want, _ := ParseURI(c.url)
		if err != nil || got != tc || !reflect.DeepEqual(uri, want) {
			t.Fatalf("recoveryEndpoint = %+v, %p, %v; want %+v, %p", uri, got, err, want, tc)
		}
	}
	c.url = "http://h/"
	if _, _, err := c.recoveryEndpoint(0); err == nil {
		t.Fatal("an unparsable url: no error, as ParseURI would give")
	}
	if c.endpointCredentials() {
		t.Fatal("endpointCredentials without a list")
	}
}

// TestReconnectDialsTheList runs upstream's Reconnect with a dialer that
// records each attempt: the attempts follow the list, each TLS handshake
// names its endpoint, and SASL comes from the URL of the endpoint dialled
// when it came from the first URL, or is the caller's otherwise.
func TestReconnectDialsTheList(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, tc := range []struct {
		name     string
		original []Authentication
		wantUser string
	}{
		{"credentials from the URLs", []Authentication{&PlainAuth{Username: "one", Password: "p1"}}, "three"},
		{"credentials of the caller", []Authentication{&PlainAuth{Username: "vault", Password: "v"}}, "vault"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEndpoints(InOrder,
				Endpoint{URL: "amqp://one:p1@node1:5672/"},
				Endpoint{URL: "amqps://two:p2@node2:5671/", TLS: &tls.Config{ServerName: "node2.tls"}},
				Endpoint{URL: "amqp://three:p3@node3:5672/"})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var dialled, serverNames []string
			var servers sync.WaitGroup
			c := &Connection{
				url:       "amqp://one:p1@node1:5672/",
				lifeCycle: newLifeCycle(),
				Config: Config{
					Endpoints: e,
					Recovery: &Recovery{ReconnectionConfig: &ReconnectionConfig{
						MaxRetryCount: 3, RetryInterval: time.Millisecond,
					}},
					Dial: func(network, addr string) (net.Conn, error) {
						mu.Lock()
						dialled = append(dialled, addr)
						mu.Unlock()
						if addr != "node2:5671" {
							return nil, errors.New("refused")
						}
						client, server := net.Pipe()
						servers.Add(1)
						go func() { // a TLS server that records the ServerName and refuses
							defer servers.Done()
							defer server.Close()
							_ = tls.Server(server, &tls.Config{GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
								mu.Lock()
								serverNames = append(serverNames, hi.ServerName)
								mu.Unlock()
								return nil, errors.New("refused")
							}}).Handshake()
						}()
						return client, nil
					},
				},
				originalSASL: tc.original,
			}
			c.closed.Store(true)
			if err := c.Reconnect(); err == nil {
				t.Fatal("Reconnect succeeded with no broker")
			}
			servers.Wait()
			if got := strings.Join(dialled, " "); got != "node1:5672 node2:5671 node3:5672" {
				t.Fatalf("dialled %s", got)
			}
			if len(serverNames) != 1 || serverNames[0] != "node2.tls" {
				t.Fatalf("TLS ServerNames %v, want [node2.tls]", serverNames)
			}
			if pa, ok := c.Config.SASL[0].(*PlainAuth); !ok || pa.Username != tc.wantUser {
				t.Fatalf("SASL of the last attempt %v, want user %s", c.Config.SASL, tc.wantUser)
			}
		})
	}
}
