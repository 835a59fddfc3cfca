package compat_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
)

// allModes are the modes every DialContext test runs in.
var allModes = []compat.Mode{compat.Upstream, compat.Drainer, compat.Legacy, compat.LegacyAutoDrain}

const (
	dialDeadline = 300 * time.Millisecond // the deadline of the blackhole cases
	promptBound  = 2 * time.Second        // how late past it (or past a cancel) a return may be
)

// noLeak checks, when deferred at the start of a test, that the test left
// no goroutine behind. The idle keep-alive connections of the Toxiproxy
// client (net/http's default transport) are not the test's.
func noLeak(t *testing.T) func() {
	ignore := []goleak.Option{
		goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	}
	return func() { goleak.VerifyNone(t, ignore...) }
}

// ms formats d in milliseconds, for the figures the tests log.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// expectDeadline runs dial with a dialDeadline deadline and checks that it
// fails with an error that Is context.DeadlineExceeded, within promptBound
// of the deadline. It logs how long past the deadline dial returned.
func expectDeadline(t *testing.T, what string, dial func(ctx context.Context) (*amqp.Connection, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dialDeadline)
	defer cancel()
	deadline, _ := ctx.Deadline()
	conn, err := dial(ctx)
	over := time.Since(deadline)
	if err == nil {
		conn.Close()
		t.Fatalf("%s: connected through a blackhole", what)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ctx.Err()) {
		t.Fatalf("%s: err = %v, want one that Is context.DeadlineExceeded", what, err)
	}
	if over > promptBound {
		t.Fatalf("%s: returned %v after the deadline, want < %v", what, over, promptBound)
	}
	t.Logf("%s: returned %.1f ms after the %v deadline: %v", what, ms(over), dialDeadline, err)
}

// TestDialContextBlackholeFromStart: Toxiproxy accepts the TCP connection
// and swallows everything the client sends from the first byte on, as a
// blackholed broker behind a load balancer does. DialContext and
// DialConfigContext return at the deadline.
func TestDialContextBlackholeFromStart(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := toxi.NewProxy(t, testenv.AMQPAddr(t))
			p.Timeout(toxi.Upstream, 0)
			defer noLeak(t)()
			expectDeadline(t, "DialContext/"+mode.String(), func(ctx context.Context) (*amqp.Connection, error) {
				return compat.DialContext(ctx, p.URL(), mode)
			})
			expectDeadline(t, "DialConfigContext/"+mode.String(), func(ctx context.Context) (*amqp.Connection, error) {
				return compat.DialConfigContext(ctx, p.URL(), amqp.Config{Recovery: &amqp.Recovery{}}, mode)
			})
		})
	}
}

// TestDialContextTCPConnectBlackhole: the connect itself never completes
// (a blackholed SYN), simulated by a WithDialer dialer that waits for its
// ctx. DialContext returns at the deadline.
func TestDialContextTCPConnectBlackhole(t *testing.T) {
	hang := func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			defer noLeak(t)()
			expectDeadline(t, "TCP connect/"+mode.String(), func(ctx context.Context) (*amqp.Connection, error) {
				return compat.DialContext(ctx, testenv.AMQPURL(t), mode, compat.WithDialer(hang))
			})
		})
	}
}

// gatedConn holds the first read back (the broker's connection.start)
// until the test lets it through, so that the test can change the network
// while the client is known to be in its AMQP handshake.
type gatedConn struct {
	net.Conn
	once    sync.Once
	arrived chan<- struct{} // a value when the first read has returned
	release <-chan struct{} // closed by the test: the first read may return
}

func (g *gatedConn) Read(b []byte) (int, error) {
	n, err := g.Conn.Read(b)
	g.once.Do(func() {
		g.arrived <- struct{}{}
		<-g.release
	})
	return n, err
}

// TestDialContextAMQPHandshakeBlackhole: the TCP connect succeeds and the
// AMQP handshake starts, then nothing more comes back:
//
//   - silent listener: a listener that reads the protocol header and never
//     sends connection.start;
//   - toxiproxy: the real broker's connection.start reaches the client, then
//     Toxiproxy swallows everything the client sends (its start-ok).
//
// DialContext returns at the deadline.
func TestDialContextAMQPHandshakeBlackhole(t *testing.T) {
	for _, mode := range allModes {
		t.Run("silent listener/"+mode.String(), func(t *testing.T) {
			defer noLeak(t)()
			s := newSilent(t)
			defer s.Close()
			expectDeadline(t, "silent listener/"+mode.String(), func(ctx context.Context) (*amqp.Connection, error) {
				return compat.DialContext(ctx, at(t, s.Addr(), ""), mode)
			})
			select {
			case <-s.heard:
			default:
				t.Fatal("the listener never heard the protocol header: the dial did not reach the AMQP handshake")
			}
		})
	}
	for _, mode := range allModes {
		t.Run("toxiproxy after connection.start/"+mode.String(), func(t *testing.T) {
			p := toxi.NewProxy(t, testenv.AMQPAddr(t))
			defer noLeak(t)()
			arrived := make(chan struct{}, 1)
			release := make(chan struct{})
			var releaseOnce sync.Once
			let := func() { releaseOnce.Do(func() { close(release) }) }
			defer let()
			dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &gatedConn{Conn: c, arrived: arrived, release: release}, nil
			}
			type result struct {
				conn *amqp.Connection
				err  error
				at   time.Time
			}
			ctx, cancel := context.WithTimeout(context.Background(), dialDeadline)
			defer cancel()
			deadline, _ := ctx.Deadline()
			done := make(chan result, 1)
			go func() {
				conn, err := compat.DialContext(ctx, p.URL(), mode, compat.WithDialer(dialer))
				done <- result{conn, err, time.Now()}
			}()
			select {
			case <-arrived: // connection.start is in; the client answers once it is let through
			case r := <-done:
				t.Fatalf("DialContext returned before connection.start arrived: %v", r.err)
			}
			p.Timeout(toxi.Upstream, 0)
			let()
			r := <-done
			if r.err == nil {
				r.conn.Close()
				t.Fatal("connected through a blackhole")
			}
			over := r.at.Sub(deadline)
			if !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want one that Is context.DeadlineExceeded", r.err)
			}
			if errors.Is(r.err, amqp.ErrCredentials) {
				t.Fatalf("err = %v: a timeout after start-ok Is amqp.ErrCredentials", r.err)
			}
			if over > promptBound {
				t.Fatalf("returned %v after the deadline, want < %v", over, promptBound)
			}
			t.Logf("toxiproxy after connection.start/%s: returned %.1f ms after the %v deadline: %v", mode, ms(over), dialDeadline, r.err)
		})
	}
}

// TestDialTLSContextHandshakeBlackhole: the TCP connect succeeds and the
// peer never answers the ClientHello (a silent listener; Toxiproxy
// swallowing the ClientHello). DialTLSContext returns at the deadline.
func TestDialTLSContextHandshakeBlackhole(t *testing.T) {
	tc := &tls.Config{InsecureSkipVerify: true}
	for _, mode := range allModes {
		t.Run("silent listener/"+mode.String(), func(t *testing.T) {
			defer noLeak(t)()
			s := newSilent(t)
			defer s.Close()
			expectDeadline(t, "TLS silent listener/"+mode.String(), func(ctx context.Context) (*amqp.Connection, error) {
				return compat.DialTLSContext(ctx, at(t, s.Addr(), "amqps"), tc, mode)
			})
			select {
			case <-s.heard:
			default:
				t.Fatal("the listener never heard the ClientHello: the dial did not reach the TLS handshake")
			}
			if tc.ServerName != "" {
				t.Fatalf("DialTLSContext set ServerName %q on the caller's tls.Config", tc.ServerName)
			}
		})
	}
	for _, mode := range allModes {
		t.Run("toxiproxy/"+mode.String(), func(t *testing.T) {
			p := toxi.NewProxy(t, testenv.AMQPAddr(t))
			p.Timeout(toxi.Upstream, 0)
			defer noLeak(t)()
			expectDeadline(t, "TLS toxiproxy/"+mode.String(), func(ctx context.Context) (*amqp.Connection, error) {
				return compat.DialTLSContext(ctx, at(t, p.Addr(), "amqps"), tc, mode)
			})
		})
	}
}

// TestDialContextCancelMidHandshake: ctx is cancelled (no deadline) once
// the client is in its AMQP or TLS handshake with a silent peer:
// DialContext and DialTLSContext return promptly with context.Canceled.
func TestDialContextCancelMidHandshake(t *testing.T) {
	for _, scheme := range []string{"amqp", "amqps"} {
		for _, mode := range allModes {
			t.Run(scheme+"/"+mode.String(), func(t *testing.T) {
				defer noLeak(t)()
				s := newSilent(t)
				defer s.Close()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				cancelled := make(chan time.Time, 1)
				go func() { // cancel once the client is in its handshake
					<-s.heard
					cancelled <- time.Now()
					cancel()
				}()
				var err error
				var conn *amqp.Connection
				if scheme == "amqps" {
					conn, err = compat.DialTLSContext(ctx, at(t, s.Addr(), scheme), &tls.Config{InsecureSkipVerify: true}, mode)
				} else {
					conn, err = compat.DialContext(ctx, at(t, s.Addr(), scheme), mode)
				}
				returned := time.Now()
				if err == nil {
					conn.Close()
					t.Fatal("connected to a silent peer")
				}
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("err = %v, want one that Is context.Canceled", err)
				}
				took := returned.Sub(<-cancelled)
				if took > promptBound {
					t.Fatalf("returned %v after the cancel, want < %v", took, promptBound)
				}
				t.Logf("cancel %s/%s: returned %.1f ms after the cancel: %v", scheme, mode, ms(took), err)
			})
		}
	}
}

// TestDialContextConnects: DialContext, DialConfigContext and
// DialTLSContext (with an amqp URL, for which upstream ignores the
// tls.Config) connect in every mode; the connection works after ctx has
// ended, since ctx bounds the dial only, and closes cleanly.
func TestDialContextConnects(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			dials := map[string]func() (*amqp.Connection, error){
				"DialContext": func() (*amqp.Connection, error) {
					return compat.DialContext(ctx, testenv.AMQPURL(t), mode)
				},
				"DialConfigContext": func() (*amqp.Connection, error) {
					cfg := amqp.Config{
						Heartbeat:  5 * time.Second,
						Properties: amqp.Table{"connection_name": "compat-dialcontext-" + mode.String()},
						Recovery:   &amqp.Recovery{},
					}
					conn, err := compat.DialConfigContext(ctx, testenv.AMQPURL(t), cfg, mode)
					if err == nil && (conn.Config.Heartbeat != 5*time.Second || !conn.IsRecoveryEnabled()) {
						t.Errorf("the config was not honoured: heartbeat %v, recovery %v", conn.Config.Heartbeat, conn.IsRecoveryEnabled())
					}
					return conn, err
				},
				"DialTLSContext": func() (*amqp.Connection, error) {
					return compat.DialTLSContext(ctx, testenv.AMQPURL(t), &tls.Config{}, mode)
				},
			}
			conns := map[string]*amqp.Connection{}
			for name, dial := range dials {
				start := time.Now()
				conn, err := dial()
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				defer conn.Close()
				if conn.ReadMode() != mode.String() {
					t.Fatalf("%s: ReadMode %q, want %q", name, conn.ReadMode(), mode)
				}
				t.Logf("%s/%s: connected in %.1f ms", name, mode, ms(time.Since(start)))
				conns[name] = conn
			}
			<-ctx.Done() // the deadline passes: the socket's handshake deadline must be gone
			for name, conn := range conns {
				roundTrip(t, conn)
				if err := conn.Close(); err != nil {
					t.Fatalf("%s: Close: %v", name, err)
				}
			}
		})
	}
}

// TestDialContextConnectionTimeout: a ctx without a deadline is still
// bounded as upstream bounds its handshake, by the URL's
// connection_timeout.
func TestDialContextConnectionTimeout(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			defer noLeak(t)()
			s := newSilent(t)
			defer s.Close()
			u, err := url.Parse(at(t, s.Addr(), ""))
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("connection_timeout", "300")
			u.RawQuery = q.Encode()
			start := time.Now()
			_, err = compat.DialContext(context.Background(), u.String(), mode)
			over := time.Since(start) - 300*time.Millisecond
			if err == nil || !strings.Contains(err.Error(), "not connected within 300ms") {
				t.Fatalf("err = %v, want not connected within 300ms", err)
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want one that Is os.ErrDeadlineExceeded, not context.DeadlineExceeded (ctx did not end)", err)
			}
			if over > promptBound {
				t.Fatalf("returned %v after the connection timeout", over)
			}
			t.Logf("connection_timeout/%s: returned %.1f ms after it: %v", mode, ms(over), err)
		})
	}
}

// TestDialContextRefuses: arguments refused without dialling.
func TestDialContextRefuses(t *testing.T) {
	dialled := false
	dialer := compat.WithDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialled = true
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	})
	broker := testenv.AMQPURL(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := compat.DialConfigContext(context.Background(), broker, amqp.Config{Dial: net.Dial}, compat.Drainer, dialer); err == nil || !strings.Contains(err.Error(), "WithDialer") {
		t.Errorf("Config.Dial: %v, want an error naming WithDialer", err)
	}
	if _, err := compat.DialContext(context.Background(), broker, compat.Mode(42), dialer); err == nil {
		t.Error("Mode(42) accepted")
	}
	if _, err := compat.DialContext(context.Background(), "http://nowhere/", compat.Upstream, dialer); err == nil {
		t.Error("an http URL accepted")
	}
	if _, err := compat.DialContext(cancelled, broker, compat.Upstream, dialer); !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "guest:guest") {
		t.Errorf("a cancelled ctx: %v, want context.Canceled, without the password", err)
	}
	if dialled {
		t.Error("dialled despite refusing")
	}
}
