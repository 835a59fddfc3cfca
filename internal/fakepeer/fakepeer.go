// Package fakepeer is an in-process fake AMQP 0-9-1 broker for frame-level
// tests of a client's read path.
//
// A Peer listens on 127.0.0.1. For each client connection it performs the
// connection handshake itself (protocol header, start/start-ok, tune/tune-ok,
// open/open-ok) and then hands the connection, as a Session, to a script
// written by the test. The script decides every byte the client reads and
// when: it can send frames whole, in slices with pauses between them, or
// malformed; it can stop reading, close or reset the socket. Nothing is sent
// that the script did not ask for; in particular the peer sends no
// heartbeats of its own. A client dialled with amqp.Dial negotiates a 10s
// heartbeat and gives up after about 15s of silence, far longer than a
// script should run.
//
// A typical test:
//
//	p := fakepeer.Listen(t)
//	p.Serve(func(s *fakepeer.Session) error {
//		ch, err := s.AnswerChannelOpen()
//		if err != nil {
//			return err
//		}
//		return s.SendSlices(fakepeer.ChannelFlow(ch, false), 3, 10*time.Millisecond)
//	})
//	conn, err := amqp.Dial(p.URL())
//	...
//
// Everything the Peer starts is stopped by the cleanup that Listen registers
// with testing.TB, so a test that uses it leaves no goroutine behind.
package fakepeer

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// Defaults of the connection.tune the peer proposes: RabbitMQ's own
// channel-max and frame-max, and no heartbeat, so that the peer never owes
// the client heartbeats unless a test asks for them.
const (
	defaultChannelMax = 2047
	defaultFrameMax   = 131072
	defaultHeartbeat  = 0
	defaultIOTimeout  = 15 * time.Second
)

type config struct {
	channelMax uint16
	frameMax   uint32
	heartbeat  uint16
	ioTimeout  time.Duration
}

// Option configures a Peer.
type Option func(*config)

// WithChannelMax sets the channel-max the peer proposes in connection.tune
// (default 2047).
func WithChannelMax(n uint16) Option { return func(c *config) { c.channelMax = n } }

// WithFrameMax sets the frame-max the peer proposes in connection.tune
// (default 131072; 0 proposes no limit). The client may negotiate it down;
// Session.FrameMax reports the outcome.
func WithFrameMax(n uint32) Option { return func(c *config) { c.frameMax = n } }

// WithHeartbeat sets the heartbeat, in seconds, the peer proposes in
// connection.tune (default 0). The peer still sends no heartbeats itself;
// a script that needs them sends HeartbeatFrame.
func WithHeartbeat(seconds uint16) Option { return func(c *config) { c.heartbeat = seconds } }

// WithIOTimeout bounds every single read and write of a Session, the
// handshake included (default 15s; 0 means no bound). It exists so that a
// script waiting for a frame the client never sends fails the test instead
// of hanging it.
func WithIOTimeout(d time.Duration) Option { return func(c *config) { c.ioTimeout = d } }

// Peer is a fake broker listening on 127.0.0.1.
type Peer struct {
	tb   testing.TB
	cfg  config
	ln   net.Listener
	done chan struct{} // closed when cleanup starts
	wg   sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	turn   chan struct{} // closed once the latest Serve has accepted
}

// Listen starts a Peer on 127.0.0.1 on a free port. It must be called from
// the test's goroutine: it fails the test with tb.Fatalf if it cannot
// listen. The Peer is shut down by a tb.Cleanup, which closes the listener
// and every connection and waits for every script to return.
func Listen(tb testing.TB, opts ...Option) *Peer {
	tb.Helper()
	cfg := config{
		channelMax: defaultChannelMax,
		frameMax:   defaultFrameMax,
		heartbeat:  defaultHeartbeat,
		ioTimeout:  defaultIOTimeout,
	}
	for _, o := range opts {
		o(&cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("fakepeer: listen: %v", err)
	}
	turn := make(chan struct{})
	close(turn)
	p := &Peer{
		tb:    tb,
		cfg:   cfg,
		ln:    ln,
		done:  make(chan struct{}),
		conns: map[net.Conn]struct{}{},
		turn:  turn,
	}
	tb.Cleanup(p.shutdown)
	return p
}

// URL returns the AMQP URL of the peer, amqp://guest:guest@127.0.0.1:port/.
func (p *Peer) URL() string {
	return fmt.Sprintf("amqp://guest:guest@%s/", p.ln.Addr())
}

// Addr returns the address the peer listens on, for clients that dial the
// socket themselves.
func (p *Peer) Addr() net.Addr { return p.ln.Addr() }

// Accept waits for the next client connection and performs the connection
// handshake on it. It returns the Session once connection.open-ok is sent.
// Since amqp.Dial returns only after the handshake, Accept and Dial must run
// in different goroutines; Serve does that for the common case.
func (p *Peer) Accept() (*Session, error) {
	c, err := p.ln.Accept()
	if err != nil {
		return nil, fmt.Errorf("fakepeer: accept: %w", err)
	}
	if !p.track(c) {
		c.Close()
		return nil, fmt.Errorf("fakepeer: accept: peer is shut down")
	}
	s := newSession(p, c.(*net.TCPConn))
	if err := s.handshake(); err != nil {
		s.Close()
		return nil, fmt.Errorf("fakepeer: handshake: %w", err)
	}
	return s, nil
}

// Serve runs script on the next client connection, in a goroutine the
// peer owns, once the handshake is done. Scripts of successive Serve calls
// get successive connections, in call order, which is what a reconnecting
// client needs.
//
// A failed accept or handshake, or a non-nil error from script, fails the
// test through tb.Errorf. After a failed script the peer closes the
// connection, so that a client waiting for a reply it will never get
// returns. After a script that returned nil the peer keeps the connection
// and answers like a minimal broker so that the client can finish cleanly:
// channel.open with channel.open-ok, channel.close with channel.close-ok and
// connection.close with connection.close-ok; it discards every other frame.
// It does not read at all if the script called StopReading.
func (p *Peer) Serve(script func(s *Session) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.tb.Errorf("fakepeer: Serve called after the peer was shut down")
		return
	}
	prev, next := p.turn, make(chan struct{})
	p.turn = next
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		s, err := p.acceptAfter(prev)
		close(next)
		if err != nil {
			p.tb.Errorf("fakepeer: Serve: %v", err)
			return
		}
		if err := script(s); err != nil {
			p.tb.Errorf("fakepeer: script: %v", err)
			s.Close()
			return
		}
		s.idle()
	}()
}

// acceptAfter accepts once prev is closed, that is once every earlier
// Serve has its connection, so that connections go to scripts in order.
func (p *Peer) acceptAfter(prev chan struct{}) (*Session, error) {
	select {
	case <-prev:
	case <-p.done:
		return nil, fmt.Errorf("no client connected before the test ended")
	}
	s, err := p.Accept()
	if err != nil {
		select {
		case <-p.done:
			return nil, fmt.Errorf("no client connected before the test ended")
		default:
		}
	}
	return s, err
}

// track records c so that shutdown can close it; it reports false when
// the peer is already shut down.
func (p *Peer) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Peer) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// shutdown is Listen's cleanup. Closing the listener and the connections
// unblocks every Accept, read and write; closing done ends every Pause and
// every wait on Session.Done. Only then can it wait for the scripts.
func (p *Peer) shutdown() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()

	close(p.done)
	p.ln.Close()
	for c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
