// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// coalescingModes are the read paths with the group commit on.
var coalescingModes = []ReadPath{Drainer(DrainerOptions{CoalescePublishes: true}), Legacy(LegacyOptions{CoalescePublishes: true})}

// stepRWC holds every Write while held, each until the test lets it go, and fails every
// Write once failAfter more have passed (-1: never). A vectored write over it is one Write
// per buffer.
type stepRWC struct {
	*recordingRWC
	mu        sync.Mutex
	held      bool
	failAfter int
	entered   chan struct{} // a token per Write held
	release   chan struct{} // a send lets one held Write go; closed by open, all go
}

func (s *stepRWC) Write(p []byte) (int, error) {
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	if held {
		s.entered <- struct{}{}
		<-s.release
	}
	s.mu.Lock()
	fail := s.failAfter == 0
	if s.failAfter > 0 {
		s.failAfter--
	}
	s.mu.Unlock()
	if fail {
		return 0, errors.New("socket broken")
	}
	return s.recordingRWC.Write(p)
}

func (s *stepRWC) hold() {
	s.mu.Lock()
	s.held = true
	s.mu.Unlock()
}

// open lets every Write go, from now on.
func (s *stepRWC) open() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held {
		s.held = false
		close(s.release)
	}
}

// ackPeer opens a connection in read path rp over a stepRWC on a fake broker, and channels
// 1 to n, whose delivery tags up to 1,000 count as handed out (acks need no deliveries here).
// The broker then reads until connection.close, answering channel.close, and hands each
// method on over seen as "channel type"; served is closed once it has ended.
func ackPeer(t *testing.T, rp ReadPath, n int) (*Connection, []*Channel, *stepRWC, <-chan string, <-chan struct{}) {
	t.Helper()
	pipe, srv := newSession(t)
	s := &stepRWC{recordingRWC: &recordingRWC{ReadWriteCloser: pipe}, failAfter: -1,
		entered: make(chan struct{}, 64), release: make(chan struct{})}
	t.Cleanup(func() { s.open(); s.Close() })
	seen, served := make(chan string, 1024), make(chan struct{}) // more than a test sends
	go func() {
		defer close(served)
		srv.connectionOpen()
		for i := 1; i <= n; i++ {
			srv.channelOpen(i)
		}
		for {
			f, err := srv.r.ReadFrame()
			if err != nil {
				return
			}
			m, ok := f.(*methodFrame)
			if !ok {
				continue
			}
			seen <- fmt.Sprintf("%d %T", m.ChannelId, m.Method)
			switch m.Method.(type) {
			case *connectionClose:
				srv.send(0, &connectionCloseOk{})
				return
			case *channelClose:
				srv.send(int(m.ChannelId), &channelCloseOk{})
			}
		}
	}()
	cfg := defaultConfig()
	cfg.ReadPath = rp
	c, err := Open(s, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	chans := make([]*Channel, n)
	for i := range chans {
		if chans[i], err = c.Channel(); err != nil {
			t.Fatalf("Channel: %v", err)
		}
		chans[i].tags.highest.Store(1000)
	}
	return c, chans, s, seen, served
}

// waitNext waits, without sleeping, until the batch that waits in c's group commit has joined.
func waitNext(t *testing.T, c *Connection, what string, joined func(b *groupBatch) bool) {
	t.Helper()
	g := &c.rp.base().group
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		g.mu.Lock()
		ok := g.next != nil && joined(g.next)
		g.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not in the next write after 10s", what)
		}
	}
}

// frameBytes is what upstream's c.send writes for f.
func frameBytes(t *testing.T, f frame) []byte {
	var b bytes.Buffer
	if err := (&writer{&b}).WriteFrame(f); err != nil {
		t.Fatalf("encoding %v: %v", f, err)
	}
	return b.Bytes()
}

func publishQ(ch *Channel) error {
	return ch.PublishWithContext(context.Background(), "", "q", false, false, Publishing{Body: []byte("body")})
}

// TestAckGroupCommit: with coalescing, acks, nacks and rejects that arrive while a publish is
// being written join the next batch with publishes, which goes out in one socket write whose
// bytes are those of each written one by one, in the order they came; an ack that finds
// nobody writing writes at once, alone, with no more allocations than with coalescing off.
func TestAckGroupCommit(t *testing.T) {
	for _, rp := range coalescingModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			c, chans, s, _, served := ackPeer(t, rp, 5)
			writes := c.Stats().Writes
			s.set(true, nil)
			s.hold()
			errs := make(chan error, 5)
			go func() { errs <- publishQ(chans[0]) }()
			<-s.entered // channel 1's publish is in its write
			joiners := []func() error{
				func() error { return chans[1].Ack(1, false) },
				func() error { return publishQ(chans[2]) },
				func() error { return chans[3].Nack(2, true, true) },
				func() error { return chans[4].Reject(3, false) },
			}
			for i, f := range joiners {
				go func(f func() error) { errs <- f() }(f)
				waitNext(t, c, fmt.Sprintf("joiner %d", i), func(b *groupBatch) bool { return len(b.vecs) == i+1 })
			}
			s.open()
			for i := 0; i < 5; i++ {
				if err := <-errs; err != nil {
					t.Fatalf("publish or ack: %v", err)
				}
			}
			if n := c.Stats().Writes - writes; n != 2 {
				t.Errorf("%d socket writes, want 2: the publish, then the four that came during it", n)
			}
			pub := func(ch uint16) []byte {
				b, err := upstreamPublishBytes(ch, "", "q", false, false, Publishing{Body: []byte("body")}, c.Config.FrameSize)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			want := bytes.Join([][]byte{
				pub(1),
				frameBytes(t, &methodFrame{ChannelId: 2, Method: &basicAck{DeliveryTag: 1}}),
				pub(3),
				frameBytes(t, &methodFrame{ChannelId: 4, Method: &basicNack{DeliveryTag: 2, Multiple: true, Requeue: true}}),
				frameBytes(t, &methodFrame{ChannelId: 5, Method: &basicReject{DeliveryTag: 3}}),
			}, nil)
			if got := s.set(true, nil); !bytes.Equal(got, want) {
				t.Fatalf("wrote\n%x\nwant, as one by one:\n%x", got, want)
			}

			writes = c.Stats().Writes
			if err := chans[1].Ack(4, false); err != nil {
				t.Fatalf("lone Ack: %v", err)
			}
			want = frameBytes(t, &methodFrame{ChannelId: 2, Method: &basicAck{DeliveryTag: 4}})
			if got, n := s.set(false, nil), c.Stats().Writes-writes; n != 1 || !bytes.Equal(got, want) {
				t.Fatalf("a lone ack: %d writes of %x, want 1 of %x", n, got, want)
			}
			// The fewest of three tries each, alternated: other goroutines' allocations count too.
			on, off := math.Inf(1), math.Inf(1)
			for i := 0; i < 6; i++ {
				c.rp.base().coalesce = i%2 == 0
				n := testing.AllocsPerRun(20, func() { _ = chans[1].Ack(5, false) })
				if i%2 == 0 {
					on = math.Min(on, n)
				} else {
					off = math.Min(off, n)
				}
			}
			c.rp.base().coalesce = true
			// One allocation of slack: AllocsPerRun counts the whole process's mallocs and
			// rounds down, and the fake peer's goroutines sometimes add one per run to either
			// setting (18 against 19 both ways, in about 1 of 20 runs on a quiet machine).
			if t.Logf("a lone ack: %.1f allocations coalescing, %.1f not", on, off); on > off+1 {
				t.Error("a lone ack allocates more coalescing")
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			<-served
		})
	}
}

// TestAckOrderKept: an ack in a batch returns once that batch is written, so what its channel
// sends after it (a nack, channel.close) comes after it on the wire, even while other
// publishes are being written: channel 1's publish, channel 2's ack, channel 3's publish,
// then channel 2's nack (in the batch after the publish's) or close (before or after it).
func TestAckOrderKept(t *testing.T) {
	for _, rp := range coalescingModes {
		for _, then := range []string{"nack", "close"} {
			t.Run(rp.Mode()+"/then "+then, func(t *testing.T) {
				testAckOrderKept(t, rp, then)
			})
		}
	}
}

func testAckOrderKept(t *testing.T, rp ReadPath, then string) {
	c, chans, s, seen, served := ackPeer(t, rp, 3)
	s.hold()
	errs, acked := make(chan error, 3), make(chan struct{})
	go func() { errs <- publishQ(chans[0]) }()
	<-s.entered
	go func() {
		err := chans[1].Ack(1, false)
		close(acked)
		if err == nil && then == "nack" {
			err = chans[1].Nack(2, false, true)
		} else if err == nil {
			err = chans[1].Close()
		}
		errs <- err
	}()
	waitNext(t, c, "the ack", func(b *groupBatch) bool { return len(b.vecs) == 1 })
	s.release <- struct{}{} // channel 1's publish is written: the ack writes its batch
	<-s.entered
	go func() { errs <- publishQ(chans[2]) }()
	waitNext(t, c, "channel 3's publish", func(b *groupBatch) bool { return len(b.vecs) == 1 })
	s.release <- struct{}{} // the ack is written: channel 3's publish writes
	<-s.entered
	<-acked
	if then == "nack" {
		waitNext(t, c, "the nack", func(b *groupBatch) bool { return len(b.vecs) == 1 })
	}
	s.open()
	for i := 0; i < 3; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("publish, ack, %s: %v", then, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-served
	var got []string
	for len(seen) > 0 {
		got = append(got, <-seen)
	}
	last := "2 *amqp091.basicNack"
	if then == "close" {
		last = "2 *amqp091.channelClose"
	}
	want := []string{"1 *amqp091.basicPublish", "2 *amqp091.basicAck", "3 *amqp091.basicPublish", last, "0 *amqp091.connectionClose"}
	if then == "close" && len(got) == len(want) && got[2] == last {
		// channel.close is an RPC, through c.sendM: it may go before channel 3's publish.
		got[2], got[3] = got[3], got[2]
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("the broker read %q, want %q", got, want)
	}
}

// TestAckWriteFailsMidBatch: a batch whose write fails at the ack, after a publish of the batch
// went out, gives both the write's error and fails the connection; later acks get ErrClosed,
// and no goroutine is left.
func TestAckWriteFailsMidBatch(t *testing.T) {
	for _, rp := range coalescingModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			c, chans, s, _, served := ackPeer(t, rp, 3)
			closed := c.NotifyClose(make(chan *Error, 1))
			s.hold()
			first, errs := make(chan error, 1), make(chan error, 2)
			go func() { first <- publishQ(chans[0]) }()
			<-s.entered
			go func() { errs <- publishQ(chans[2]) }()
			waitNext(t, c, "channel 3's publish", func(b *groupBatch) bool { return len(b.vecs) == 1 })
			go func() { errs <- chans[1].Ack(1, false) }()
			waitNext(t, c, "the ack", func(b *groupBatch) bool { return len(b.vecs) == 2 })
			s.mu.Lock()
			s.failAfter = 2 // the first publish and the batch's publish pass, the ack fails
			s.mu.Unlock()
			s.open()
			if err := <-first; err != nil {
				t.Fatalf("the first publish: %v", err)
			}
			for i := 0; i < 2; i++ {
				if err := <-errs; err == nil || !strings.Contains(err.Error(), "socket broken") {
					t.Errorf("a publish or ack in the failed write returned %v; want the write's error", err)
				}
			}
			select {
			case e := <-closed:
				if e == nil || e.Code != FrameError {
					t.Fatalf("connection closed with %v, want a frame error", e)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("connection not shut down 10s after a failed write")
			}
			if err := chans[1].Ack(2, false); !errors.Is(err, ErrClosed) {
				t.Fatalf("Ack on the failed connection: %v; want ErrClosed", err)
			}
			s.Close()
			<-served
		})
	}
}
