// Package toxi puts a Toxiproxy TCP proxy between a test and its broker, to
// inject network faults: resets, stalls, latency, throttling.
//
// The Toxiproxy server runs as a separate process, so that its CPU time is
// not counted as the test's. It is started once per test binary, on first
// use, built from the Toxiproxy version go.mod requires and cached under the
// module's .cache directory; if TOXIPROXY_URL is set, the server running
// there is used instead. The server is stopped when the test binary ends,
// which is why test packages that use toxi must call testenv.Main:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package toxi

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// A Proxy is a Toxiproxy proxy owned by one test. Its methods fail that
// test on error, so like testing.T.FailNow they must be called from the
// goroutine running it.
type Proxy struct {
	tb   testing.TB
	p    *toxiproxy.Proxy
	addr string       // where tests dial it (differs from p.Listen in a container)
	n    atomic.Int64 // numbers toxics, so several of one kind can coexist
}

// NewProxy starts a proxy to upstream (host:port) for the running test. It
// listens on a free port of 127.0.0.1 and is deleted, closing every
// connection through it, when the test and its subtests finish.
func NewProxy(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	api, err := server()
	if err != nil {
		tb.Fatal(err)
	}
	if to := os.Getenv("TOXIPROXY_UPSTREAM_AMQP"); to != "" && upstream == testenv.AMQPAddr(tb) {
		// Toxiproxy runs in its own container (CI): it reaches the broker
		// by the broker's service name, not by our loopback address.
		upstream = to
	}
	name := proxyName(tb.Name())
	client := toxiproxy.NewClient(api)
	var p *toxiproxy.Proxy
	var addr string // where tests dial the proxy, when not its own Listen
	ports, err := listenPorts(os.Getenv("TOXIPROXY_LISTEN_PORTS"))
	if err != nil {
		tb.Fatal(err)
	}
	if ports == nil {
		p, err = client.CreateProxy(name, "127.0.0.1:0", upstream)
	} else {
		// Only a published range of ports reaches a containerised
		// Toxiproxy; try ports of the range until one is free.
		for i := 0; i < len(ports); i++ {
			port := ports[(os.Getpid()+int(proxies.Add(1))+i)%len(ports)]
			if p, err = client.CreateProxy(name, fmt.Sprintf("0.0.0.0:%d", port), upstream); err == nil {
				addr = fmt.Sprintf("127.0.0.1:%d", port)
				break
			}
		}
	}
	if err != nil {
		tb.Fatalf("toxi: create proxy %s to %s: %v", name, upstream, err)
	}
	tb.Cleanup(func() {
		if err := p.Delete(); err != nil {
			tb.Errorf("toxi: delete proxy %s: %v", name, err)
		}
	})
	if addr == "" {
		addr = p.Listen
	}
	return &Proxy{tb: tb, p: p, addr: addr}
}

// listenPorts parses TOXIPROXY_LISTEN_PORTS ("26000-26063"): the ports a
// containerised Toxiproxy publishes. Empty means any loopback port.
func listenPorts(spec string) ([]int, error) {
	if spec == "" {
		return nil, nil
	}
	var lo, hi int
	if _, err := fmt.Sscanf(spec, "%d-%d", &lo, &hi); err != nil || lo <= 0 || hi < lo || hi > 65535 {
		return nil, fmt.Errorf("toxi: TOXIPROXY_LISTEN_PORTS=%q: want a range such as 26000-26063", spec)
	}
	ports := make([]int, 0, hi-lo+1)
	for port := lo; port <= hi; port++ {
		ports = append(ports, port)
	}
	return ports, nil
}

// proxies numbers proxy names: a test may create several, and its name is
// reused by -count and by other packages sharing a TOXIPROXY_URL server,
// hence the process ID too.
var proxies atomic.Int64

// proxyName derives a proxy name from a test name. Toxiproxy puts names in
// URL paths, so subtest slashes and the like become underscores.
func proxyName(test string) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, test)
	return fmt.Sprintf("%s-%d-%d", clean, os.Getpid(), proxies.Add(1))
}

// Addr returns the host:port the proxy listens on.
func (p *Proxy) Addr() string { return p.addr }

// URL returns testenv.AMQPURL with its host:port replaced by the proxy's, so
// that dialling it reaches the test broker through the proxy with the same
// user, password, vhost and options.
func (p *Proxy) URL() string {
	p.tb.Helper()
	u, err := url.Parse(testenv.AMQPURL(p.tb))
	if err != nil {
		p.tb.Fatalf("toxi: parse testenv.AMQPURL: %v", err)
	}
	u.Host = p.Addr()
	return u.String()
}

// Disable closes the proxy's listener and every connection through it,
// until Enable: the upstream looks down.
func (p *Proxy) Disable() {
	p.tb.Helper()
	if err := p.p.Disable(); err != nil {
		p.tb.Fatalf("toxi: disable proxy %s: %v", p.p.Name, err)
	}
}

// Enable reopens a disabled proxy on the same address.
func (p *Proxy) Enable() {
	p.tb.Helper()
	if err := p.p.Enable(); err != nil {
		p.tb.Fatalf("toxi: enable proxy %s: %v", p.p.Name, err)
	}
}

// A Stream is the direction of a connection that a toxic acts on.
type Stream string

// The two directions. Toxiproxy names them from the proxy's point of view:
// data flows upstream to the server it proxies, and downstream back.
const (
	Upstream   Stream = "upstream"   // client to broker
	Downstream Stream = "downstream" // broker to client
)

// ResetPeer closes connections once data arrives on s, after waiting
// timeout. It returns the toxic's name, for RemoveToxic.
//
// The close is a TCP RST only for connections opened after ArmResets (or
// while another reset_peer toxic existed): Toxiproxy sets SO_LINGER 0,
// which turns a close into a reset, when it links a connection, not when a
// toxic is added. Connections opened before see an orderly close (EOF).
func (p *Proxy) ResetPeer(s Stream, timeout time.Duration) string {
	p.tb.Helper()
	return p.add("reset_peer", s, toxiproxy.Attributes{"timeout": ms(timeout)})
}

// ArmResets makes a later ResetPeer a true TCP reset for the connections
// opened from now on: it adds a reset_peer toxic that never fires
// (toxicity 0) on both streams, whose presence is what makes Toxiproxy
// give new connections SO_LINGER 0. Call it before dialling.
func (p *Proxy) ArmResets() {
	p.tb.Helper()
	for _, s := range []Stream{Upstream, Downstream} {
		name := fmt.Sprintf("reset_peer_armed_%s_%d", s, p.n.Add(1))
		if _, err := p.p.AddToxic(name, "reset_peer", string(s), 0, toxiproxy.Attributes{"timeout": 0}); err != nil {
			p.tb.Fatalf("toxi: proxy %s: arm resets: %v", p.p.Name, err)
		}
	}
}

// Timeout stops all data on s and closes connections after timeout; with a
// timeout of 0 they stay open, silent, until the toxic is removed. It
// returns the toxic's name, for RemoveToxic.
func (p *Proxy) Timeout(s Stream, timeout time.Duration) string {
	p.tb.Helper()
	return p.add("timeout", s, toxiproxy.Attributes{"timeout": ms(timeout)})
}

// Latency delays data on s by latency, plus or minus up to jitter. It
// returns the toxic's name, for RemoveToxic.
func (p *Proxy) Latency(s Stream, latency, jitter time.Duration) string {
	p.tb.Helper()
	return p.add("latency", s, toxiproxy.Attributes{"latency": ms(latency), "jitter": ms(jitter)})
}

// Bandwidth limits s to kbps kilobytes (not bits) per second. It returns
// the toxic's name, for RemoveToxic.
func (p *Proxy) Bandwidth(s Stream, kbps int64) string {
	p.tb.Helper()
	return p.add("bandwidth", s, toxiproxy.Attributes{"rate": kbps})
}

// Slicer splits data on s into chunks of about avgSize bytes, varying by up
// to sizeVariation, each sent delay after the previous one: it exercises
// frame reassembly. It returns the toxic's name, for RemoveToxic.
func (p *Proxy) Slicer(s Stream, avgSize, sizeVariation int, delay time.Duration) string {
	p.tb.Helper()
	return p.add("slicer", s, toxiproxy.Attributes{
		"average_size":   avgSize,
		"size_variation": sizeVariation,
		"delay":          delay.Microseconds(), // the one toxic in µs
	})
}

// LimitData closes connections once n bytes have passed on s. It returns
// the toxic's name, for RemoveToxic.
func (p *Proxy) LimitData(s Stream, n int64) string {
	p.tb.Helper()
	return p.add("limit_data", s, toxiproxy.Attributes{"bytes": n})
}

// RemoveToxic removes the named toxic. Toxics need not be removed before
// the test ends: deleting the proxy removes them.
func (p *Proxy) RemoveToxic(name string) {
	p.tb.Helper()
	if err := p.p.RemoveToxic(name); err != nil {
		p.tb.Fatalf("toxi: proxy %s: remove toxic %s: %v", p.p.Name, name, err)
	}
}

// add adds a toxic of the given type that affects every connection.
func (p *Proxy) add(typ string, s Stream, attrs toxiproxy.Attributes) string {
	p.tb.Helper()
	name := fmt.Sprintf("%s_%s_%d", typ, s, p.n.Add(1))
	if _, err := p.p.AddToxic(name, typ, string(s), 1, attrs); err != nil {
		p.tb.Fatalf("toxi: proxy %s: add %s toxic: %v", p.p.Name, typ, err)
	}
	return name
}

// ms converts d to the whole milliseconds most toxics take, rounding up so
// that a small non-zero duration does not become "none".
func ms(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
