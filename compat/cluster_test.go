package compat_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// at returns the broker's URL with its host:port replaced by addr (same
// credentials and vhost), and scheme if not empty.
func at(t *testing.T, addr, scheme string) string {
	t.Helper()
	u, err := url.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	if scheme != "" {
		u.Scheme = scheme
	}
	return u.String()
}

// silent is a listener that accepts connections, reads what the client
// says and never says a word: an AMQP (or TLS) handshake with it waits for
// ever.
type silent struct {
	ln    net.Listener
	heard chan struct{} // a value when a connection's first bytes arrive (the client is in its handshake), if there is room
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
	once  sync.Once
}

func newSilent(t *testing.T) *silent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silent{ln: ln, heard: make(chan struct{}, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				buf := make([]byte, 512)
				for first := true; ; first = false {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if first {
						select {
						case s.heard <- struct{}{}:
						default:
						}
					}
				}
			}()
		}
	}()
	t.Cleanup(s.Close)
	return s
}

func (s *silent) Addr() string { return s.ln.Addr().String() }

func (s *silent) Close() {
	s.once.Do(func() {
		s.ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
}

// forwarder is a TCP forwarder to the broker that the test can kill:
// Close refuses new connections and cuts every forwarded one, as a node
// that dies does.
type forwarder struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
	once   sync.Once
}

func newForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, target: target}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, b)
			f.mu.Unlock()
			f.wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer f.wg.Done()
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(b, c)
			go pipe(c, b)
		}
	}()
	t.Cleanup(f.Close)
	return f
}

func (f *forwarder) Addr() string { return f.ln.Addr().String() }

func (f *forwarder) Close() {
	f.once.Do(func() {
		f.ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
}

// slogTo is a logger that writes every level to w under mu.
func slogTo(mu *sync.Mutex, w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{mu, w}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// roundTrip opens a channel, declares a queue and closes the channel.
func roundTrip(t *testing.T, conn *amqp.Connection) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
}

var clusterModes = []compat.Mode{compat.Upstream, compat.Drainer, compat.LegacyAutoDrain}

// TestDialClusterSkipsDeadEndpoints: a refused endpoint and one that
// accepts and never answers come first; the dial lands on the live
// broker, the silent one costing one attempt timeout.
func TestDialClusterSkipsDeadEndpoints(t *testing.T) {
	live := testenv.AMQPAddr(t)
	for _, mode := range clusterModes {
		t.Run(mode.String(), func(t *testing.T) {
			s := newSilent(t)
			urls := []string{at(t, "127.0.0.1:1", ""), at(t, s.Addr(), ""), at(t, live, "")}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			conn, err := compat.DialCluster(ctx, urls, mode, compat.WithAttemptTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			took := time.Since(start)
			if got := compat.Endpoint(conn); got != live {
				t.Fatalf("landed on %s, want the live broker %s", got, live)
			}
			if took > 10*time.Second {
				t.Fatalf("took %v: the silent endpoint was not bounded by the 1 s attempt timeout", took)
			}
			if conn.ReadMode() != mode.String() {
				t.Fatalf("ReadMode %q, want %q", conn.ReadMode(), mode)
			}
			if eps := conn.Config.Endpoints; eps == nil || eps.Len() != 3 {
				t.Fatalf("Config.Endpoints = %v, want the list of 3", eps)
			}
			roundTrip(t, conn)
			t.Logf("%s: connected in %v", mode, took)
		})
	}
}

// TestDialClusterGivesUp: every endpoint dead, a bound on attempts: the
// error names the last endpoint's failure; with the logger, every failed
// attempt and every failed pass is logged.
func TestDialClusterGivesUp(t *testing.T) {
	urls := []string{at(t, "127.0.0.1:1", ""), at(t, "127.0.0.1:2", "")}
	var log strings.Builder
	var mu sync.Mutex
	logger := slogTo(&mu, &log)
	_, err := compat.DialCluster(context.Background(), urls, compat.Drainer,
		compat.WithMaxAttempts(5), compat.WithBackoff(time.Millisecond, 2*time.Millisecond), compat.WithLogger(logger))
	if err == nil || !strings.Contains(err.Error(), "5 attempts failed") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("err = %v, want 5 attempts failed, the last on 127.0.0.1:1", err)
	}
	if strings.Contains(err.Error(), "guest:guest") {
		t.Fatalf("the error shows the password: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(log.String(), "attempt failed"); n != 5 {
		t.Fatalf("%d failed attempts logged, want 5:\n%s", n, log.String())
	}
	if n := strings.Count(log.String(), "every endpoint failed"); n != 2 {
		t.Fatalf("%d failed passes logged, want 2:\n%s", n, log.String())
	}
}

func TestDialClusterRejectsBadArguments(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		urls []string
		opts []compat.Option
		want string
	}{
		{"no urls", nil, nil, "at least one endpoint"},
		{"bad url", []string{"amqp://a/", "http://b/"}, nil, "endpoint 1"},
		{"TLS for a stranger", []string{"amqps://a/"}, []compat.Option{compat.WithEndpointTLS("amqps://b/", &tls.Config{})}, "not one of the urls"},
		{"Config.Dial", []string{"amqp://a/"}, []compat.Option{compat.WithConfig(amqp.Config{Dial: net.Dial})}, "WithDialer"},
		{"negative attempts", []string{"amqp://a/"}, []compat.Option{compat.WithMaxAttempts(-1)}, "invalid options"},
		{"order", []string{"amqp://a/"}, []compat.Option{compat.WithOrder(amqp.EndpointOrder(9))}, "unknown endpoint order"},
	} {
		if _, err := compat.DialCluster(ctx, tc.urls, compat.Upstream, tc.opts...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := compat.DialCluster(ctx, []string{"amqp://a/"}, compat.Mode(42)); err == nil {
		t.Error("Mode(42) accepted")
	}
}

// TestDialClusterCancel: ctx ends during the TCP connect, the TLS
// handshake or the AMQP handshake: DialCluster returns promptly, with an
// error that is ctx.Err(), and leaves no goroutine behind.
func TestDialClusterCancel(t *testing.T) {
	hang := func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done() // a connect that never completes (a blackholed SYN)
		return nil, ctx.Err()
	}
	for _, tc := range []struct {
		name   string
		scheme string
		dialer compat.DialFunc
	}{
		{"TCP connect", "", hang},
		{"TLS handshake", "amqps", nil},
		{"AMQP handshake", "", nil},
	} {
		for _, mode := range clusterModes {
			t.Run(tc.name+"/"+mode.String(), func(t *testing.T) {
				defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
				s := newSilent(t)
				defer s.Close()
				opts := []compat.Option{compat.WithAttemptTimeout(time.Minute)}
				if tc.scheme == "amqps" {
					opts = append(opts, compat.WithEndpointTLS(at(t, s.Addr(), "amqps"), &tls.Config{InsecureSkipVerify: true}))
				}
				started := make(chan struct{}, 1)
				if tc.dialer != nil {
					opts = append(opts, compat.WithDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
						started <- struct{}{}
						return tc.dialer(ctx, network, addr)
					}))
				} else {
					started = nil
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				cancelled := make(chan time.Time, 1)
				go func() { // cancel once the dial is stuck where the case wants it
					if started != nil {
						<-started
					} else {
						<-s.heard
					}
					cancelled <- time.Now()
					cancel()
				}()
				_, err := compat.DialCluster(ctx, []string{at(t, s.Addr(), tc.scheme)}, mode, opts...)
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("err = %v, want one that Is context.Canceled", err)
				}
				took := time.Since(<-cancelled)
				if took > 2*time.Second {
					t.Fatalf("returned %v after the cancel", took)
				}
				t.Logf("returned %v after the cancel: %v", took, err)
			})
		}
	}
	t.Run("deadline", func(t *testing.T) {
		s := newSilent(t)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := compat.DialCluster(ctx, []string{at(t, s.Addr(), "")}, compat.Drainer, compat.WithAttemptTimeout(time.Minute))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
	})
}

// TestDialClusterRecoversOntoTheNextEndpoint: connected through a
// forwarder (endpoint 1) with the broker itself as endpoint 2, the
// forwarder dies: upstream's automatic recovery, with the list, lands on
// endpoint 2, and the channel works again.
func TestDialClusterRecoversOntoTheNextEndpoint(t *testing.T) {
	live := testenv.AMQPAddr(t)
	for _, order := range []amqp.EndpointOrder{amqp.InOrder, amqp.RoundRobin} {
		for _, mode := range clusterModes {
			t.Run(order.String()+"/"+mode.String(), func(t *testing.T) {
				f := newForwarder(t, live)
				cfg := amqp.Config{Recovery: &amqp.Recovery{ReconnectionConfig: &amqp.ReconnectionConfig{
					MaxRetryCount: 10, RetryInterval: 10 * time.Millisecond,
				}}}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var mu sync.Mutex
				var dialled []string // by WithDialer's dialer, which recovery uses too
				dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
					mu.Lock()
					dialled = append(dialled, addr)
					mu.Unlock()
					return (&net.Dialer{}).DialContext(ctx, network, addr)
				}
				conn, err := compat.DialCluster(ctx, []string{at(t, f.Addr(), ""), at(t, live, "")}, mode,
					compat.WithConfig(cfg), compat.WithOrder(order), compat.WithDialer(dialer))
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				if got := compat.Endpoint(conn); got != f.Addr() {
					t.Fatalf("first on %s, want the forwarder %s", got, f.Addr())
				}
				ch, err := conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				q, err := ch.QueueDeclare("compat-cluster-recovery-"+order.String()+"-"+mode.String(), false, true, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				states := make(chan *amqp.StateChanged, 16)
				conn.NotifyStateChange(states)

				f.Close() // the node dies
				deadline := time.After(30 * time.Second)
				for reconnecting := false; ; {
					select {
					case sc := <-states:
						if sc.To == amqp.StateReconnecting {
							reconnecting = true
						}
						if sc.To == amqp.StateClosed {
							t.Fatalf("the connection closed instead of recovering: %+v", sc)
						}
						if sc.To != amqp.StateOpen || !reconnecting {
							continue
						}
					case <-deadline:
						t.Fatal("not recovered within 30 s")
					}
					break
				}
				if got := compat.Endpoint(conn); got != live {
					t.Fatalf("recovered onto %s, want endpoint 2 %s", got, live)
				}
				mu.Lock()
				want := f.Addr() + " " + live // RoundRobin continues after the forwarder
				if order == amqp.InOrder {
					want = f.Addr() + " " + f.Addr() + " " + live // a pass starts at the first
				}
				if got := strings.Join(dialled, " "); got != want {
					t.Errorf("dialled %s, want %s", got, want)
				}
				mu.Unlock()
				pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer pcancel()
				if err := ch.PublishWithContext(pctx, "", q.Name, false, false, amqp.Publishing{Body: []byte("after")}); err != nil {
					t.Fatalf("publish after recovery: %v", err)
				}
				if _, err := ch.QueueDelete(q.Name, false, false, false); err != nil {
					t.Fatalf("the recovered channel: %v", err)
				}
			})
		}
	}
}

// TestDialClusterAsksCredentialsPerAttempt: Config.Credentials is asked at
// every attempt of DialCluster. The first answer is a wrong password: that
// attempt is refused with an error naming the endpoint and the user, never
// a password, and the next attempt logs in with the provider's next
// answer.
func TestDialClusterAsksCredentialsPerAttempt(t *testing.T) {
	uri, err := amqp.ParseURI(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	live := at(t, testenv.AMQPAddr(t), "")
	for _, mode := range clusterModes {
		t.Run(mode.String(), func(t *testing.T) {
			var mu sync.Mutex
			var calls int
			cfg := amqp.Config{Credentials: func(context.Context) (amqp.Authentication, error) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if calls == 1 {
					return &amqp.PlainAuth{Username: uri.Username, Password: "wrong-password"}, nil
				}
				return &amqp.PlainAuth{Username: uri.Username, Password: uri.Password}, nil
			}}
			var log strings.Builder
			var logMu sync.Mutex
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := compat.DialCluster(ctx, []string{live, live}, mode, compat.WithConfig(cfg),
				compat.WithLogger(slogTo(&logMu, &log)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			roundTrip(t, conn)
			mu.Lock()
			n := calls
			mu.Unlock()
			if n != 2 {
				t.Fatalf("the provider was asked %d times, want once per attempt: 2", n)
			}
			logMu.Lock()
			defer logMu.Unlock()
			refused := log.String()
			if !strings.Contains(refused, "login to "+testenv.AMQPAddr(t)) || !strings.Contains(refused, uri.Username) ||
				strings.Contains(refused, "wrong-password") {
				t.Fatalf("the refused attempt's log should name %s and user %s, never the password:\n%s", testenv.AMQPAddr(t), uri.Username, refused)
			}
		})
	}
}
