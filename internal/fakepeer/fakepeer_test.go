package fakepeer_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// TestMain checks for leaked goroutines after every test and its cleanups
// have run; a deferred goleak.VerifyNone would run before the peer's
// cleanup and see the peer's own goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bound is how long a test waits for the client to react. It is generous
// because it only matters when something is broken.
const bound = 10 * time.Second

func dial(t *testing.T, p *fakepeer.Peer) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(p.URL())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	// After a failure the connection may still be open; CloseDeadline
	// cannot hang on a peer that no longer answers.
	t.Cleanup(func() { _ = conn.CloseDeadline(time.Now().Add(bound)) })
	return conn
}

func TestDialChannelClose(t *testing.T) {
	p := fakepeer.Listen(t)
	opened := make(chan uint16, 1)
	p.Serve(func(s *fakepeer.Session) error {
		if got := s.FrameMax(); got != 131072 {
			return errors.New("unexpected frame-max")
		}
		ch, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		opened <- ch
		return s.AnswerClose()
	})

	conn := dial(t, p)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("Channel: %v", err)
	}
	if got := <-opened; got != 1 {
		t.Errorf("peer saw channel.open on channel %d, want 1", got)
	}
	if !conn.Properties["capabilities"].(amqp.Table)["publisher_confirms"].(bool) {
		t.Errorf("capabilities: %v", conn.Properties["capabilities"])
	}
	if err := ch.Close(); err != nil {
		t.Fatalf("Channel.Close: %v", err)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestIdleAnswersAfterScript covers Serve's behaviour once a script has
// returned nil: the client can still open a channel and close cleanly.
func TestIdleAnswersAfterScript(t *testing.T) {
	p := fakepeer.Listen(t)
	p.Serve(func(*fakepeer.Session) error { return nil })

	conn := dial(t, p)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("Channel: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Fatalf("Channel.Close: %v", err)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func consume(t *testing.T, conn *amqp.Connection) <-chan amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("Channel: %v", err)
	}
	deliveries, err := ch.Consume("q", "", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("Consume: %v", err)
	}
	return deliveries
}

func receive(t *testing.T, deliveries <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-deliveries:
		if !ok {
			t.Fatal("deliveries closed before a delivery arrived")
		}
		return d
	case <-time.After(bound):
		t.Fatal("no delivery")
	}
	panic("unreachable")
}

func TestFragmentedDelivery(t *testing.T) {
	body := []byte("a body long enough to span many seven-octet slices of the wire")
	p := fakepeer.Listen(t)
	p.Serve(func(s *fakepeer.Session) error {
		ch, tag, err := s.AnswerChannelAndConsume()
		if err != nil {
			return err
		}
		frames := fakepeer.BasicDeliver(ch, tag, 1, false, "ex", "rk", body, s.FrameMax())
		if err := s.SendSlices(frames, 7, 2*time.Millisecond); err != nil {
			return err
		}
		return s.AnswerClose()
	})

	conn := dial(t, p)
	d := receive(t, consume(t, conn))
	if !bytes.Equal(d.Body, body) {
		t.Errorf("body %q, want %q", d.Body, body)
	}
	if d.DeliveryTag != 1 || d.Exchange != "ex" || d.RoutingKey != "rk" {
		t.Errorf("delivery tag %d exchange %q routing key %q", d.DeliveryTag, d.Exchange, d.RoutingKey)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestDeliverySplitAtFrameMax has the peer split a body over several body
// frames, as a broker must when the body exceeds frame-max.
func TestDeliverySplitAtFrameMax(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 1000) // 10000 octets
	p := fakepeer.Listen(t, fakepeer.WithFrameMax(4096))
	p.Serve(func(s *fakepeer.Session) error {
		ch, tag, err := s.AnswerChannelAndConsume()
		if err != nil {
			return err
		}
		return s.Send(fakepeer.BasicDeliver(ch, tag, 7, true, "", "q", body, s.FrameMax()))
	})

	conn := dial(t, p)
	d := receive(t, consume(t, conn))
	if !bytes.Equal(d.Body, body) {
		t.Errorf("body of %d octets differs from the %d sent", len(d.Body), len(body))
	}
	if d.DeliveryTag != 7 || !d.Redelivered {
		t.Errorf("delivery tag %d redelivered %v", d.DeliveryTag, d.Redelivered)
	}
}

func waitClose(t *testing.T, closes <-chan *amqp.Error) *amqp.Error {
	t.Helper()
	select {
	case err := <-closes:
		if err == nil {
			t.Fatal("NotifyClose closed without an error")
		}
		return err
	case <-time.After(bound):
		t.Fatal("NotifyClose did not fire")
	}
	panic("unreachable")
}

func TestBadFrameEnd(t *testing.T) {
	p := fakepeer.Listen(t)
	p.Serve(func(s *fakepeer.Session) error {
		ch, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		bad := fakepeer.ChannelFlow(ch, true)
		bad[len(bad)-1] = 0x00
		return s.Send(bad)
	})

	conn := dial(t, p)
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	// Opening a channel holds the script back until NotifyClose is set up.
	if _, err := conn.Channel(); err != nil {
		t.Fatalf("Channel: %v", err)
	}
	if err := waitClose(t, closes); err.Code != amqp.FrameError {
		t.Errorf("NotifyClose: %v, want code %d", err, amqp.FrameError)
	}
}

func TestReset(t *testing.T) {
	p := fakepeer.Listen(t)
	p.Serve(func(s *fakepeer.Session) error {
		if _, err := s.AnswerChannelOpen(); err != nil {
			return err
		}
		return s.Reset()
	})

	conn := dial(t, p)
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	if _, err := conn.Channel(); err != nil {
		t.Fatalf("Channel: %v", err)
	}
	t.Logf("NotifyClose: %v", waitClose(t, closes))
}

// rawHandshake is the client's half of the handshake, sent in one write:
// the peer only checks the class and method of each frame.
func rawHandshake() []byte {
	var b []byte
	b = append(b, "AMQP\x00\x00\x09\x01"...)
	b = append(b, fakepeer.MethodFrame(0, 10, 11, new(fakepeer.Args).
		Table(fakepeer.Table{}).ShortStr("PLAIN").LongStr("\x00guest\x00guest").ShortStr("en_US").Bytes())...)
	b = append(b, fakepeer.MethodFrame(0, 10, 31, new(fakepeer.Args).Short(2047).Long(4096).Short(0).Bytes())...)
	b = append(b, fakepeer.MethodFrame(0, 10, 40, new(fakepeer.Args).ShortStr("/").ShortStr("").Bits(false).Bytes())...)
	return b
}

func rawDial(t *testing.T, p *fakepeer.Peer) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(rawHandshake()); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return c
}

// TestStopReading checks with a raw client that, once the peer stops
// reading, the client's writes block: a write deadline, not a sleep, ends
// the flood, and the bytes written stay bounded by the socket buffers.
func TestStopReading(t *testing.T) {
	p := fakepeer.Listen(t)
	stopped := make(chan struct{})
	p.Serve(func(s *fakepeer.Session) error {
		if err := s.StopReading(); err != nil {
			return err
		}
		close(stopped)
		<-s.Done()
		return nil
	})
	c := rawDial(t, p)
	<-stopped

	// Unblocked, loopback moves 64 MiB in far less than the deadline; the
	// socket buffers on both sides hold a few MiB.
	const limit = 64 << 20
	chunk := make([]byte, 64<<10)
	written := 0
	if err := c.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	var err error
	for written < limit && err == nil {
		var n int
		n, err = c.Write(chunk)
		written += n
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after %d octets: write error %v, want a deadline", written, err)
	}
	t.Logf("client writes blocked after %d octets", written)
}

// TestAcceptRaw drives Accept and the Session from the test goroutine,
// checking the exact bytes of the peer's handshake replies on the way.
func TestAcceptRaw(t *testing.T) {
	p := fakepeer.Listen(t, fakepeer.WithChannelMax(7), fakepeer.WithHeartbeat(3))
	c := rawDial(t, p)
	s, err := p.Accept()
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	if got := s.FrameMax(); got != 4096 {
		t.Errorf("FrameMax %d, want the client's 4096", got)
	}

	// connection.start, then connection.tune with the options, then open-ok.
	readPeerFrame(t, c, 10, 10)
	tune := readPeerFrame(t, c, 10, 30)
	a := fakepeer.ReadArgs(tune.Args())
	if cm, fm, hb := a.Short(), a.Long(), a.Short(); a.Err() != nil || cm != 7 || fm != 131072 || hb != 3 {
		t.Errorf("tune %d %d %d (%v)", cm, fm, hb, a.Err())
	}
	readPeerFrame(t, c, 10, 41)

	// A heartbeat is skipped; the publish is returned with its arguments.
	publish := new(fakepeer.Args).Short(0).ShortStr("ex").ShortStr("rk").Bits(true, false).Bytes()
	if _, err := c.Write(append(fakepeer.HeartbeatFrame(), fakepeer.MethodFrame(1, 60, 40, publish)...)); err != nil {
		t.Fatal(err)
	}
	f, err := s.ExpectMethod(1, 60, 40)
	if err != nil {
		t.Fatalf("ExpectMethod: %v", err)
	}
	a = fakepeer.ReadArgs(f.Args())
	if r, ex, rk, bits := a.Short(), a.ShortStr(), a.ShortStr(), a.Bits(2); a.Err() != nil || r != 0 || ex != "ex" || rk != "rk" || !reflect.DeepEqual(bits, []bool{true, false}) {
		t.Errorf("publish %d %q %q %v (%v)", r, ex, rk, bits, a.Err())
	}

	// A wrong method is reported.
	if _, err := c.Write(fakepeer.MethodFrame(1, 60, 40, publish)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExpectMethod(1, 20, 10); err == nil {
		t.Error("ExpectMethod accepted basic.publish as channel.open")
	}

	// Close gives the client a clean end of stream.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("after Close: %v", err)
	}
}

// TestResetRaw checks that Reset is seen as a reset, not an end of stream.
func TestResetRaw(t *testing.T) {
	p := fakepeer.Listen(t)
	c := rawDial(t, p)
	s, err := p.Accept()
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("after Reset: %v, want a connection reset", err)
	}
}

func readPeerFrame(t *testing.T, c net.Conn, classID, methodID uint16) fakepeer.Frame {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(bound)); err != nil {
		t.Fatal(err)
	}
	var h [7]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		t.Fatalf("read frame header: %v", err)
	}
	size := int(h[3])<<24 | int(h[4])<<16 | int(h[5])<<8 | int(h[6])
	rest := make([]byte, size+1)
	if _, err := io.ReadFull(c, rest); err != nil {
		t.Fatalf("read frame: %v", err)
	}
	if rest[size] != fakepeer.FrameEnd {
		t.Fatalf("frame-end 0x%02X", rest[size])
	}
	f := fakepeer.Frame{Type: h[0], Channel: uint16(h[1])<<8 | uint16(h[2]), Payload: rest[:size]}
	if c, m := f.Method(); c != classID || m != methodID {
		t.Fatalf("got %v, want method %d.%d", f, classID, methodID)
	}
	return f
}

func TestEncoding(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want []byte
	}{
		{"heartbeat", fakepeer.HeartbeatFrame(), []byte{8, 0, 0, 0, 0, 0, 0, 0xCE}},
		{"channel.open-ok", fakepeer.ChannelOpenOk(1),
			[]byte{1, 0, 1, 0, 0, 0, 8, 0, 20, 0, 11, 0, 0, 0, 0, 0xCE}},
		{"basic.ack", fakepeer.BasicAck(2, 5, true),
			[]byte{1, 0, 2, 0, 0, 0, 13, 0, 60, 0, 80, 0, 0, 0, 0, 0, 0, 0, 5, 1, 0xCE}},
		{"basic.nack", fakepeer.BasicNack(2, 5, false, true),
			[]byte{1, 0, 2, 0, 0, 0, 13, 0, 60, 0, 120, 0, 0, 0, 0, 0, 0, 0, 5, 2, 0xCE}},
		{"connection.blocked", fakepeer.ConnectionBlocked("x"),
			[]byte{1, 0, 0, 0, 0, 0, 6, 0, 10, 0, 60, 1, 'x', 0xCE}},
		{"header", fakepeer.HeaderFrame(1, 60, 3, 0x8000, new(fakepeer.Args).ShortStr("t").Bytes()),
			[]byte{2, 0, 1, 0, 0, 0, 16, 0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0x80, 0, 1, 't', 0xCE}},
		{"body", fakepeer.BodyFrame(1, []byte("hi")), []byte{3, 0, 1, 0, 0, 0, 2, 'h', 'i', 0xCE}},
		{"bits", new(fakepeer.Args).Bits(true, false, true, false, false, false, false, false, true).Bytes(),
			[]byte{0x05, 0x01}},
		{"table", new(fakepeer.Args).Table(fakepeer.Table{"b": true, "a": int32(-1)}).Bytes(),
			[]byte{0, 0, 0, 11, 1, 'a', 'I', 0xFF, 0xFF, 0xFF, 0xFF, 1, 'b', 't', 1}},
	} {
		if !bytes.Equal(tc.got, tc.want) {
			t.Errorf("%s:\n got % x\nwant % x", tc.name, tc.got, tc.want)
		}
	}
}

func TestContentSplit(t *testing.T) {
	body := bytes.Repeat([]byte{'z'}, 10000)
	b := fakepeer.Content(1, body, 4096)
	var sizes []int
	for len(b) > 0 {
		size := int(b[3])<<24 | int(b[4])<<16 | int(b[5])<<8 | int(b[6])
		sizes = append(sizes, size+8)
		b = b[size+8:]
	}
	// The header frame, then 4088+4088+1824 octets of body in whole frames.
	if want := []int{22, 4096, 4096, 1832}; !reflect.DeepEqual(sizes, want) {
		t.Errorf("frame sizes %v, want %v", sizes, want)
	}
	if got := fakepeer.Content(1, nil, 4096); len(got) != 22 {
		t.Errorf("empty body: %d octets, want a lone header frame", len(got))
	}
}

func TestTableRoundTrip(t *testing.T) {
	in := fakepeer.Table{
		"bool": true, "i8": int8(-2), "u8": uint8(2), "i16": int16(-3), "u16": uint16(3),
		"i32": int32(-4), "u32": uint32(4), "i64": int64(-5), "f32": float32(1.5), "f64": 2.5,
		"str": "s", "bytes": []byte{1, 2}, "time": time.Unix(1700000000, 0),
		"table": fakepeer.Table{"x": "y"}, "array": []any{int32(1), "two", nil}, "void": nil,
	}
	a := fakepeer.ReadArgs(new(fakepeer.Args).Table(in).LongLong(42).Bytes())
	out := a.Table()
	if tail := a.LongLong(); a.Err() != nil || tail != 42 {
		t.Fatalf("after table: %d, %v", tail, a.Err())
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip:\n got %#v\nwant %#v", out, in)
	}
	short := fakepeer.ReadArgs([]byte{0, 0, 0, 9, 1})
	short.Table()
	if short.Err() == nil {
		t.Error("truncated table decoded without error")
	}
}

// recorder stands in for the test's testing.TB so that a test can check
// what the peer reports.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) reported() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

// TestServeReportsFailures checks that a failing script and a connection
// that never came are reported to the test, and that the client of a
// failed script is not left waiting.
func TestServeReportsFailures(t *testing.T) {
	var rec *recorder
	t.Run("peer", func(t *testing.T) {
		rec = &recorder{TB: t}
		p := fakepeer.Listen(rec)
		p.Serve(func(s *fakepeer.Session) error {
			_, err := s.ExpectMethod(1, 60, 20) // the client sends channel.open
			return err
		})
		p.Serve(func(*fakepeer.Session) error { return nil }) // no client comes

		conn := dial(t, p)
		if _, err := conn.Channel(); err == nil {
			t.Error("Channel succeeded against a failed script")
		}
	})
	got := rec.reported()
	if len(got) != 2 ||
		!strings.Contains(got[0], "want method 60.20 on channel 1, got method 20.10 on channel 1") ||
		!strings.Contains(got[1], "no client connected") {
		t.Errorf("reported %q", got)
	}
}
