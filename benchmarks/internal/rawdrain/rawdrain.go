// Package rawdrain is the drain benchmark's floor: the least a Go program
// can spend to consume a queue over AMQP 0-9-1, so that the client
// libraries' figures can be read against it (issue #18).
//
// It is deliberately not a client. One goroutine dials, logs in, consumes
// and acks multiple, reading frames through one bufio.Reader into one
// reused buffer: no library, no second goroutine, no allocation per
// message. Everything a client does beyond that (dispatch, a goroutine
// that is not the reader, a Delivery per message, a chan) is what the
// library costs; what this costs is what the Go runtime and the kernel
// cost, which no client written in Go can go below. It handles only what
// a drain meets: any method it does not expect ends it with an error
// naming that method.
//
// Config.Read chooses how the socket is read. By default it is read as
// any Go program reads one, through package net and the runtime's network
// poller. The blocking modes ask issue #40's question, whether reading
// with blocking read(2) on a thread of its own would earn the drainer an
// option: they read the same frames the same way, but from the socket's
// descriptor taken out of the poller, on the calling goroutine locked to
// its OS thread.
package rawdrain

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"runtime"
	"strings"
	"time"
)

// Config says what to drain.
type Config struct {
	URL      string // amqp://user:pass@host:port/vhost
	Queue    string
	N        int    // deliveries to receive before returning
	Prefetch uint16 // basic.qos prefetch count
	AckEvery int    // deliveries per multiple ack
	Read     Read   // how the socket is read; the zero value is the netpoller
}

// Read is how Drain reads (and writes) its socket.
type Read int

const (
	// Netpoll reads through package net: a read that finds nothing parks
	// the goroutine, and the runtime's network poller (epoll) wakes it.
	Netpoll Read = iota
	// Blocking reads with blocking read(2) through syscall.Read, on the
	// calling goroutine locked to its OS thread, from a descriptor that
	// the poller does not watch. The runtime sees each read as a system
	// call (entersyscall), so its scheduler may take the goroutine's P
	// while the thread waits in the kernel.
	Blocking
	// BlockingRaw is Blocking through syscall.RawSyscall: the runtime
	// never learns that the thread is in the kernel, so it keeps its P
	// throughout, and nothing hands the P off or takes it back. The price
	// is that a stop-the-world (a GC cycle's start) waits for the read in
	// progress, and that with GOMAXPROCS 1 nothing else could run while it
	// waits (Drain refuses it there). An experiment, never for a client.
	BlockingRaw
)

// String names r as the benchmark's notes do.
func (r Read) String() string {
	switch r {
	case Netpoll:
		return "netpoll"
	case Blocking:
		return "blocking"
	case BlockingRaw:
		return "blocking-raw"
	}
	return fmt.Sprintf("Read(%d)", int(r))
}

// Frame types and the frame-end octet of AMQP 0-9-1 (spec 4.2.3).
const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE

	// maxFrame is the frame-max this reader asks for in tune-ok: a frame
	// above it is the peer's error.
	maxFrame = 128 << 10
)

// methodID is a method's class and method number.
type methodID struct{ class, method uint16 }

func (m methodID) String() string { return fmt.Sprintf("method %d.%d", m.class, m.method) }

var (
	connectionStart   = methodID{10, 10}
	connectionTune    = methodID{10, 30}
	connectionOpenOk  = methodID{10, 41}
	connectionClose   = methodID{10, 50}
	connectionCloseOk = methodID{10, 51}
	channelOpenOk     = methodID{20, 11}
	channelClose      = methodID{20, 40}
	basicQosOk        = methodID{60, 11}
	basicConsumeOk    = methodID{60, 21}
	basicDeliver      = methodID{60, 60}
)

// ErrFrame is wrapped by every error about a frame that breaks the
// protocol.
var ErrFrame = errors.New("rawdrain: malformed frame")

// Frames reads AMQP frames from r into one buffer that every call reuses.
type Frames struct {
	r   *bufio.Reader
	buf []byte
	max int
}

// NewFrames reads frames of at most max payload bytes from r.
func NewFrames(r io.Reader, max int) *Frames {
	return &Frames{r: bufio.NewReaderSize(r, 2*max), max: max}
}

// Next returns the next frame. Its payload is valid until the next call.
func (f *Frames) Next() (typ byte, channel uint16, payload []byte, err error) {
	var h [7]byte
	if _, err := io.ReadFull(f.r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	size := int(binary.BigEndian.Uint32(h[3:]))
	if size > f.max {
		return 0, 0, nil, fmt.Errorf("%w: %d-byte payload, frame-max %d", ErrFrame, size, f.max)
	}
	if cap(f.buf) < size+1 {
		f.buf = make([]byte, size+1)
	}
	b := f.buf[:size+1]
	if _, err := io.ReadFull(f.r, b); err != nil {
		return 0, 0, nil, err
	}
	if b[size] != frameEnd {
		return 0, 0, nil, fmt.Errorf("%w: frame-end 0x%02x", ErrFrame, b[size])
	}
	return h[0], binary.BigEndian.Uint16(h[1:]), b[:size], nil
}

// method returns a method frame's id.
func method(payload []byte) (methodID, error) {
	if len(payload) < 4 {
		return methodID{}, fmt.Errorf("%w: %d-byte method frame", ErrFrame, len(payload))
	}
	return methodID{binary.BigEndian.Uint16(payload), binary.BigEndian.Uint16(payload[2:])}, nil
}

// Drain consumes cfg.N deliveries from cfg.Queue and returns how many it
// received. started is called just before basic.consume, when only the
// drain is left to measure. ctx bounds everything, the close included.
// In a blocking mode (cfg.Read) the calling goroutine stays locked to its
// OS thread until Drain returns.
func Drain(ctx context.Context, cfg Config, started func()) (received int, err error) {
	defer func() {
		// A read that ctx ended says only "i/o timeout" or, blocking,
		// end of file: say why.
		if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
		}
	}()
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return 0, err
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "5672")
	}
	user, pass := "guest", "guest"
	if u.User != nil {
		user = u.User.Username()
		if p, ok := u.User.Password(); ok {
			pass = p
		}
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	conn, release, err := connect(ctx, host, cfg.Read)
	if err != nil {
		return 0, err
	}
	defer release()

	s := &session{conn: conn, frames: NewFrames(conn, maxFrame), w: bufio.NewWriterSize(conn, 4096)}
	if err := s.open(user, pass, vhost, cfg.Prefetch); err != nil {
		return 0, err
	}
	started()
	received, err = s.drain(cfg.Queue, cfg.N, cfg.AckEvery)
	if err != nil {
		return received, err
	}
	return received, s.close()
}

// connect dials host and readies the connection to be read as read says,
// ended by ctx. release closes it and undoes what connect did, on the
// goroutine that called connect.
func connect(ctx context.Context, host string, read Read) (conn link, release func(), err error) {
	if read == BlockingRaw && runtime.GOMAXPROCS(0) < 2 {
		// The raw read holds the only P while it waits: not even ctx's
		// timer could run to end it.
		return nil, nil, fmt.Errorf("rawdrain: %v needs GOMAXPROCS of 2 or more", read)
	}
	if read != Netpoll && read != Blocking && read != BlockingRaw {
		return nil, nil, fmt.Errorf("rawdrain: unknown %v", read)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, nil, err
	}
	if read == Netpoll {
		stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
		return nc, func() { stop(); nc.Close() }, nil
	}
	// Locked before the first read, so that every read and write of the
	// session is made by one thread, as a C client's would be.
	runtime.LockOSThread()
	bc, err := newBlockingConn(nc, read == BlockingRaw) // closes nc
	if err != nil {
		runtime.UnlockOSThread()
		return nil, nil, err
	}
	// No deadline reaches a blocking read: shutdown(2) ends it.
	stop := context.AfterFunc(ctx, bc.interrupt)
	return bc, func() { stop(); bc.Close(); runtime.UnlockOSThread() }, nil
}

// link is what a session needs of its connection: a net.Conn, or the
// socket read and written with blocking system calls (blockingConn).
type link interface {
	io.ReadWriter
	SetReadDeadline(t time.Time) error
}

// session is one connection with channel 1 open.
type session struct {
	conn   link
	frames *Frames
	w      *bufio.Writer
	args   []byte // scratch for a method's arguments
}

// send writes one method frame on channel and flushes it.
func (s *session) send(channel uint16, id methodID, args []byte) error {
	var h [11]byte
	h[0] = frameMethod
	binary.BigEndian.PutUint16(h[1:], channel)
	binary.BigEndian.PutUint32(h[3:], uint32(4+len(args)))
	binary.BigEndian.PutUint16(h[7:], id.class)
	binary.BigEndian.PutUint16(h[9:], id.method)
	s.w.Write(h[:])
	s.w.Write(args)
	s.w.WriteByte(frameEnd)
	return s.w.Flush()
}

// expect reads frames until a method frame, skipping heartbeats, and
// fails unless it is want. It returns the method's arguments.
func (s *session) expect(want methodID) ([]byte, error) {
	for {
		typ, _, p, err := s.frames.Next()
		if err != nil {
			return nil, fmt.Errorf("waiting for %v: %w", want, err)
		}
		if typ == frameHeartbeat {
			continue
		}
		if typ != frameMethod {
			return nil, fmt.Errorf("%w: frame type %d while waiting for %v", ErrFrame, typ, want)
		}
		id, err := method(p)
		if err != nil {
			return nil, err
		}
		if id != want {
			return nil, unexpected(id, p[4:])
		}
		return p[4:], nil
	}
}

// unexpected describes a method the drain did not expect; a close says
// its reply text.
func unexpected(id methodID, args []byte) error {
	if (id == connectionClose || id == channelClose) && len(args) >= 3 {
		n := int(args[2])
		if len(args) >= 3+n {
			return fmt.Errorf("rawdrain: %v: %d %s", id, binary.BigEndian.Uint16(args), args[3:3+n])
		}
	}
	return fmt.Errorf("rawdrain: unexpected %v", id)
}

// Argument encoders, appending to s.args.
func (s *session) shortstr(v string) { s.args = append(append(s.args, byte(len(v))), v...) }
func (s *session) longstr(v string) {
	s.args = binary.BigEndian.AppendUint32(s.args, uint32(len(v)))
	s.args = append(s.args, v...)
}
func (s *session) u16(v uint16) { s.args = binary.BigEndian.AppendUint16(s.args, v) }
func (s *session) u32(v uint32) { s.args = binary.BigEndian.AppendUint32(s.args, v) }

// open logs in, opens channel 1 and sets its prefetch.
func (s *session) open(user, pass, vhost string, prefetch uint16) error {
	if _, err := s.conn.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return err
	}
	if _, err := s.expect(connectionStart); err != nil {
		return err
	}
	s.args = s.args[:0]
	s.u32(0) // empty client-properties table
	s.shortstr("PLAIN")
	s.longstr("\x00" + user + "\x00" + pass)
	s.shortstr("en_US")
	if err := s.send(0, methodID{10, 11}, s.args); err != nil {
		return err
	}
	tune, err := s.expect(connectionTune)
	if err != nil {
		return err
	}
	if len(tune) < 8 {
		return fmt.Errorf("%w: %d-byte connection.tune", ErrFrame, len(tune))
	}
	frameMax := binary.BigEndian.Uint32(tune[2:])
	if frameMax == 0 || frameMax > maxFrame {
		frameMax = maxFrame
	}
	s.args = s.args[:0]
	s.u16(binary.BigEndian.Uint16(tune)) // channel-max as offered
	s.u32(frameMax)
	s.u16(0) // no heartbeats: a drain lasts seconds
	if err := s.send(0, methodID{10, 31}, s.args); err != nil {
		return err
	}
	s.args = s.args[:0]
	s.shortstr(vhost)
	s.shortstr("")
	s.args = append(s.args, 0)
	if err := s.send(0, methodID{10, 40}, s.args); err != nil {
		return err
	}
	if _, err := s.expect(connectionOpenOk); err != nil {
		return err
	}
	s.args = append(s.args[:0], 0) // channel.open's reserved shortstr
	if err := s.send(1, methodID{20, 10}, s.args); err != nil {
		return err
	}
	if _, err := s.expect(channelOpenOk); err != nil {
		return err
	}
	s.args = s.args[:0]
	s.u32(0)
	s.u16(prefetch)
	s.args = append(s.args, 0)
	if err := s.send(1, methodID{60, 10}, s.args); err != nil {
		return err
	}
	_, err = s.expect(basicQosOk)
	return err
}

// drain consumes queue until n deliveries arrived, acking multiple every
// ackEvery and at the last.
func (s *session) drain(queue string, n, ackEvery int) (int, error) {
	s.args = s.args[:0]
	s.u16(0)
	s.shortstr(queue)
	s.shortstr("rawdrain")
	s.args = append(s.args, 0) // no-local, no-ack, exclusive, no-wait all off
	s.u32(0)
	if err := s.send(1, methodID{60, 20}, s.args); err != nil {
		return 0, err
	}
	if _, err := s.expect(basicConsumeOk); err != nil {
		return 0, err
	}
	var ack [9]byte // delivery-tag, multiple
	ack[8] = 1
	received := 0
	var tag uint64
	var remaining uint64 // body bytes of the current delivery still to come
	inContent := false
	for received < n {
		typ, _, p, err := s.frames.Next()
		if err != nil {
			return received, fmt.Errorf("after %d deliveries: %w", received, err)
		}
		complete := false
		switch typ {
		case frameMethod:
			id, err := method(p)
			if err != nil {
				return received, err
			}
			if id != basicDeliver {
				return received, unexpected(id, p[4:])
			}
			if tag, err = deliveryTag(p[4:]); err != nil {
				return received, err
			}
			inContent = true
		case frameHeader:
			if !inContent || len(p) < 12 {
				return received, fmt.Errorf("%w: content header outside a delivery", ErrFrame)
			}
			remaining = binary.BigEndian.Uint64(p[4:])
			complete = remaining == 0
		case frameBody:
			if !inContent || uint64(len(p)) > remaining {
				return received, fmt.Errorf("%w: body frame beyond the announced size", ErrFrame)
			}
			remaining -= uint64(len(p))
			complete = remaining == 0
		case frameHeartbeat:
		default:
			return received, fmt.Errorf("%w: frame type %d", ErrFrame, typ)
		}
		if !complete {
			continue
		}
		inContent = false
		received++
		if received%ackEvery == 0 || received == n {
			binary.BigEndian.PutUint64(ack[:], tag)
			if err := s.send(1, methodID{60, 80}, ack[:]); err != nil {
				return received, err
			}
		}
	}
	return received, nil
}

// deliveryTag reads basic.deliver's delivery-tag, after its consumer-tag.
func deliveryTag(args []byte) (uint64, error) {
	if len(args) < 1 || len(args) < 1+int(args[0])+8 {
		return 0, fmt.Errorf("%w: %d-byte basic.deliver", ErrFrame, len(args))
	}
	return binary.BigEndian.Uint64(args[1+int(args[0]):]), nil
}

// close closes the connection cleanly, so that the broker logs no
// abrupt close; deliveries still arriving are left to it (the consumer's
// unacked ones are requeued).
func (s *session) close() error {
	s.args = s.args[:0]
	s.u16(200)
	s.shortstr("drained")
	s.u16(0)
	s.u16(0)
	if err := s.send(0, connectionClose, s.args); err != nil {
		return err
	}
	_ = s.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		typ, channel, p, err := s.frames.Next()
		if err != nil {
			return fmt.Errorf("waiting for connection.close-ok: %w", err)
		}
		if typ != frameMethod || channel != 0 {
			continue
		}
		if id, err := method(p); err == nil && id == connectionCloseOk {
			return nil
		}
	}
}
