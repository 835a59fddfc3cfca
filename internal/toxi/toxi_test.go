package toxi

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// dial connects through p with a short connect timeout, so that a test
// about refused connections does not wait for the default 30s.
func dial(p *Proxy) (*amqp.Connection, error) {
	return amqp.DialConfig(p.URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
}

func mustDial(t *testing.T, p *Proxy) *amqp.Connection {
	t.Helper()
	conn, err := dial(p)
	if err != nil {
		t.Fatalf("dial through proxy: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestDialThroughProxy(t *testing.T) {
	p := NewProxy(t, testenv.AMQPAddr(t))
	conn := mustDial(t, p)
	if got := conn.RemoteAddr().String(); got != p.Addr() {
		t.Errorf("connection's remote address = %s, want the proxy's %s", got, p.Addr())
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("Channel: %v", err)
	}
	if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatalf("QueueDeclare: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Errorf("channel Close: %v", err)
	}
}

func TestResetPeerClosesConnection(t *testing.T) {
	p := NewProxy(t, testenv.AMQPAddr(t))
	conn := mustDial(t, p)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("Channel: %v", err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	p.ResetPeer(Upstream, 0)
	// The toxic acts on the next data the client sends.
	if err := ch.ExchangeDeclarePassive("amq.direct", "direct", true, false, false, false, nil); err == nil {
		t.Error("ExchangeDeclarePassive succeeded through a reset_peer toxic")
	}

	select {
	case err, ok := <-closed:
		if !ok || err == nil {
			t.Fatal("NotifyClose reported a clean close, want an error")
		}
		t.Logf("NotifyClose: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("NotifyClose did not fire within 10s of the reset")
	}
}

func TestDisableRefusesDial(t *testing.T) {
	p := NewProxy(t, testenv.AMQPAddr(t))
	p.Disable()
	if conn, err := dial(p); err == nil {
		conn.Close()
		t.Fatal("dial through a disabled proxy succeeded")
	}
	p.Enable()
	mustDial(t, p)
}

func TestProxyDeletedAfterCleanup(t *testing.T) {
	var name, addr string
	t.Run("owner", func(t *testing.T) {
		p := NewProxy(t, testenv.AMQPAddr(t))
		name, addr = p.p.Name, p.Addr()
	})
	api, err := server()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := toxiproxy.NewClient(api).Proxy(name); err == nil {
		t.Errorf("proxy %s still exists after its test finished", name)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("something still listens on %s after the proxy's test finished", addr)
	}
}

func TestToxicHelpers(t *testing.T) {
	p := NewProxy(t, testenv.AMQPAddr(t))
	names := []string{
		p.ResetPeer(Downstream, 1500*time.Millisecond),
		p.Timeout(Upstream, 0),
		p.Latency(Downstream, 100*time.Millisecond, 10*time.Millisecond),
		p.Bandwidth(Upstream, 64),
		p.Slicer(Downstream, 10, 5, 50*time.Microsecond),
		p.LimitData(Upstream, 1<<20),
	}
	want := map[string]toxiproxy.Toxic{
		names[0]: {Type: "reset_peer", Stream: "downstream", Attributes: toxiproxy.Attributes{"timeout": 1500.0}},
		names[1]: {Type: "timeout", Stream: "upstream", Attributes: toxiproxy.Attributes{"timeout": 0.0}},
		names[2]: {Type: "latency", Stream: "downstream", Attributes: toxiproxy.Attributes{"latency": 100.0, "jitter": 10.0}},
		names[3]: {Type: "bandwidth", Stream: "upstream", Attributes: toxiproxy.Attributes{"rate": 64.0}},
		names[4]: {Type: "slicer", Stream: "downstream", Attributes: toxiproxy.Attributes{"average_size": 10.0, "size_variation": 5.0, "delay": 50.0}},
		names[5]: {Type: "limit_data", Stream: "upstream", Attributes: toxiproxy.Attributes{"bytes": float64(1 << 20)}},
	}
	got, err := p.p.Toxics()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("proxy has %d toxics, want %d: %+v", len(got), len(want), got)
	}
	for _, g := range got {
		w, ok := want[g.Name]
		if !ok {
			t.Errorf("unexpected toxic %+v", g)
			continue
		}
		if g.Type != w.Type || g.Stream != w.Stream || g.Toxicity != 1 {
			t.Errorf("toxic %s = %s/%s toxicity %v, want %s/%s toxicity 1", g.Name, g.Type, g.Stream, g.Toxicity, w.Type, w.Stream)
		}
		for k, v := range w.Attributes {
			if g.Attributes[k] != v {
				t.Errorf("toxic %s: %s = %v, want %v", g.Name, k, g.Attributes[k], v)
			}
		}
	}

	for _, n := range names {
		p.RemoveToxic(n)
	}
	if got, err := p.p.Toxics(); err != nil || len(got) != 0 {
		t.Errorf("after RemoveToxic: toxics %+v, err %v; want none", got, err)
	}
}

func TestLatencyDelaysTraffic(t *testing.T) {
	p := NewProxy(t, testenv.AMQPAddr(t))
	conn := mustDial(t, p)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("Channel: %v", err)
	}
	const latency = 200 * time.Millisecond
	name := p.Latency(Downstream, latency, 0)
	start := time.Now()
	if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatalf("QueueDeclare: %v", err)
	}
	if d := time.Since(start); d < latency {
		t.Errorf("a round trip took %v through %v of latency", d, latency)
	}
	p.RemoveToxic(name)
}

func TestProxyName(t *testing.T) {
	re := regexp.MustCompile(`^TestX_sub_case_1.b-` + strconv.Itoa(os.Getpid()) + `-[0-9]+$`)
	a, b := proxyName("TestX/sub case#1.b"), proxyName("TestX/sub case#1.b")
	if !re.MatchString(a) {
		t.Errorf("proxyName = %q, want a match for %s", a, re)
	}
	if a == b {
		t.Errorf("two proxies of one test share the name %q", a)
	}
}

// TestExternalServer checks TOXIPROXY_URL, pointing it at this binary's own
// server as if it were a CI service container.
func TestExternalServer(t *testing.T) {
	api, err := server()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOXIPROXY_URL", api)
	got, err := connect(os.Getenv("TOXIPROXY_URL"), 5*time.Second)
	if err != nil || got != api {
		t.Fatalf("connect(%s) = %q, %v", api, got, err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	_, err = connect(dead, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "TOXIPROXY_URL="+dead) {
		t.Errorf("connect to nothing: err = %v, want one naming TOXIPROXY_URL", err)
	}
}

// TestServerBinaryCached checks that the server binary is reused rather
// than rebuilt once it is in the cache.
func TestServerBinaryCached(t *testing.T) {
	if os.Getenv("TOXIPROXY_URL") != "" {
		t.Log("TOXIPROXY_URL is set, so no binary was built; checking the cache anyway")
	}
	first, err := serverBinary()
	if err != nil {
		t.Fatal(err)
	}
	fi1, err := os.Stat(first)
	if err != nil {
		t.Fatal(err)
	}
	second, err := serverBinary()
	if err != nil {
		t.Fatal(err)
	}
	fi2, err := os.Stat(second)
	if err != nil {
		t.Fatal(err)
	}
	if first != second || !os.SameFile(fi1, fi2) {
		t.Errorf("second call gave %s, want the cached %s", second, first)
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	version, _, err := toxiproxyVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(".cache", "toxi", "toxiproxy-server-"+version); !strings.HasSuffix(first, want) {
		t.Errorf("binary is %s, want .../%s", first, want)
	}
}

// TestLaunchReportsEarlyExit starts a "server" that exits at once (this
// test binary, which rejects toxiproxy's flags) and checks that launch
// notices without waiting for its deadline and quotes the server's output.
func TestLaunchReportsEarlyExit(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, p, err := launch(self)
	if p == nil {
		t.Fatalf("launch returned no process (err %v)", err)
	}
	p.stop() // idempotent; launch already stopped it
	if err == nil {
		t.Fatal("launch succeeded with a binary that exits at once")
	}
	if d := time.Since(start); d > readyTimeout/2 {
		t.Errorf("launch took %v to notice the exit", d)
	}
	// The end of the usage message the test binary prints on a bad flag.
	for _, want := range []string{"server exited", "server log:", "-test.v"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
}
