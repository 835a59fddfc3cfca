package fakepeer

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// protocolHeader is what an AMQP 0-9-1 client sends first.
const protocolHeader = "AMQP\x00\x00\x09\x01"

// maxUnboundedPayload caps the payload the peer accepts while no frame-max
// is in force, so that a garbled size field fails the read instead of
// allocating gigabytes.
const maxUnboundedPayload = 64 << 20

// serverProperties are the server-properties of connection.start. The
// capabilities are the ones the client checks before it relies on a
// feature; the rest only makes the peer recognisable in client logs.
var serverProperties = Table{
	"capabilities": Table{
		"publisher_confirms":     true,
		"consumer_cancel_notify": true,
		"basic.nack":             true,
		"connection.blocked":     true,
	},
	"product":  "fakepeer",
	"platform": "Go",
	"version":  "0.0.0",
}

// Session is one client connection, after the handshake. Its methods are
// meant for one goroutine, the script's; only Done may be used anywhere.
// Reads happen only inside ReadFrame and the methods built on it: between
// two such calls the peer does not read the socket, so a client that keeps
// writing meanwhile fills the socket buffers and blocks, as it would
// against a broker that stopped reading.
type Session struct {
	p        *Peer
	conn     *net.TCPConn
	r        *bufio.Reader
	frameMax uint32
	stopped  bool
}

func newSession(p *Peer, c *net.TCPConn) *Session {
	return &Session{p: p, conn: c, r: bufio.NewReader(c)}
}

// FrameMax returns the frame-max the client settled on in
// connection.tune-ok, in octets including frame overhead (0: no limit).
// Pass it to BasicDeliver or Content to split bodies as a broker would.
func (s *Session) FrameMax() uint32 { return s.frameMax }

// Done returns a channel that is closed when the peer shuts down, at the
// end of the test. A script that must hold the connection until then, say
// after StopReading, waits on it.
func (s *Session) Done() <-chan struct{} { return s.p.done }

// ReadFrame reads the next frame the client sent, heartbeats included. It
// fails on a wrong frame-end, on a payload larger than the negotiated
// frame-max, after the peer's I/O timeout (WithIOTimeout) and after
// StopReading.
func (s *Session) ReadFrame() (Frame, error) {
	if s.stopped {
		return Frame{}, errors.New("fakepeer: ReadFrame after StopReading")
	}
	s.setDeadline(s.conn.SetReadDeadline)
	return s.readFrame()
}

func (s *Session) readFrame() (Frame, error) {
	var h [7]byte
	if _, err := io.ReadFull(s.r, h[:]); err != nil {
		return Frame{}, fmt.Errorf("fakepeer: read frame: %w", err)
	}
	f := Frame{Type: h[0], Channel: binary.BigEndian.Uint16(h[1:])}
	size := binary.BigEndian.Uint32(h[3:])
	limit := uint32(maxUnboundedPayload)
	if s.frameMax > frameOverhead {
		limit = s.frameMax - frameOverhead
	}
	if size > limit {
		return Frame{}, fmt.Errorf("fakepeer: client sent a frame payload of %d octets, limit %d", size, limit)
	}
	buf := make([]byte, int(size)+1)
	if _, err := io.ReadFull(s.r, buf); err != nil {
		return Frame{}, fmt.Errorf("fakepeer: read frame: %w", err)
	}
	if end := buf[size]; end != FrameEnd {
		return Frame{}, fmt.Errorf("fakepeer: client sent frame-end 0x%02X after %v", end, f)
	}
	f.Payload = buf[:size:size]
	return f, nil
}

// nextMethod reads frames up to the next one that is not a heartbeat,
// since a client sends heartbeats whenever it is idle for half the
// negotiated interval.
func (s *Session) nextMethod() (Frame, error) {
	for {
		f, err := s.ReadFrame()
		if err != nil || f.Type != FrameHeartbeat {
			return f, err
		}
	}
}

// ExpectMethod reads the next frame, skipping heartbeats, and fails unless
// it is the given method on the given channel.
func (s *Session) ExpectMethod(channel, classID, methodID uint16) (Frame, error) {
	f, err := s.nextMethod()
	if err != nil {
		return f, err
	}
	if c, m := f.Method(); f.Type != FrameMethod || f.Channel != channel || c != classID || m != methodID {
		return f, fmt.Errorf("fakepeer: want method %d.%d on channel %d, got %v", classID, methodID, channel, f)
	}
	return f, nil
}

// Send writes frames to the client in one write, so the client may read
// them in one go; use SendSlices to control how they arrive.
func (s *Session) Send(frames ...[]byte) error {
	return s.write(bytes.Join(frames, nil))
}

// SendSlices writes b in slices of sliceSize octets, pausing between
// slices, so that the client's reads return partial frames. Each slice is a
// separate write on a socket with Nagle's algorithm off, so with a pause
// each slice leaves as its own segment.
func (s *Session) SendSlices(b []byte, sliceSize int, pause time.Duration) error {
	if sliceSize <= 0 {
		return fmt.Errorf("fakepeer: SendSlices: slice size %d", sliceSize)
	}
	for len(b) > 0 {
		n := min(sliceSize, len(b))
		if err := s.write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		if len(b) > 0 {
			s.Pause(pause)
		}
	}
	return nil
}

func (s *Session) write(b []byte) error {
	s.setDeadline(s.conn.SetWriteDeadline)
	if _, err := s.conn.Write(b); err != nil {
		return fmt.Errorf("fakepeer: write: %w", err)
	}
	return nil
}

// Pause waits for d, or less if the peer shuts down meanwhile; then the
// next read or write fails, so a script needs no check of its own.
func (s *Session) Pause(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.p.done:
	}
}

// StopReading declares that the peer will not read this connection again,
// and shrinks the socket's receive buffer so that the client's writes
// block sooner. The client's own send buffer still takes a few MiB on
// Linux before its writes block. ReadFrame fails from now on, and after
// the script returns the peer does not read either; a script usually
// follows StopReading with <-s.Done(), Reset or Close.
func (s *Session) StopReading() error {
	s.stopped = true
	if err := s.conn.SetReadBuffer(1); err != nil { // the kernel rounds up to its minimum
		return fmt.Errorf("fakepeer: StopReading: %w", err)
	}
	return nil
}

// Reset closes the connection abortively: with SO_LINGER 0 the close sends
// a TCP RST, and the client's next read fails with a connection reset
// instead of a clean end of stream.
func (s *Session) Reset() error {
	if err := s.conn.SetLinger(0); err != nil {
		return fmt.Errorf("fakepeer: Reset: %w", err)
	}
	return s.Close()
}

// Close closes the connection normally: the client reads end of stream
// once it has read what was sent before. If the client sent data the peer
// has not read, the kernel resets the connection instead, as after Reset.
func (s *Session) Close() error {
	s.p.untrack(s.conn)
	if err := s.conn.Close(); err != nil {
		return fmt.Errorf("fakepeer: Close: %w", err)
	}
	return nil
}

// AnswerChannelOpen reads the next frame, skipping heartbeats, requires it
// to be channel.open and answers channel.open-ok. It returns the channel
// the client opened.
func (s *Session) AnswerChannelOpen() (uint16, error) {
	f, err := s.nextMethod()
	if err != nil {
		return 0, err
	}
	if c, m := f.Method(); c != classChannel || m != channelOpen {
		return 0, fmt.Errorf("fakepeer: want channel.open, got %v", f)
	}
	return f.Channel, s.Send(ChannelOpenOk(f.Channel))
}

// AnswerConsume reads the next frame, skipping heartbeats, requires it to
// be basic.consume on channel and answers basic.consume-ok with the
// consumer tag the client chose, unless the client set no-wait. It returns
// that tag, which deliveries to the consumer must carry.
func (s *Session) AnswerConsume(channel uint16) (string, error) {
	f, err := s.ExpectMethod(channel, classBasic, basicConsume)
	if err != nil {
		return "", err
	}
	a := ReadArgs(f.Args())
	a.Short()    // reserved-1
	a.ShortStr() // queue
	tag := a.ShortStr()
	bits := a.Bits(4) // no-local, no-ack, exclusive, no-wait
	if err := a.Err(); err != nil {
		return "", fmt.Errorf("fakepeer: basic.consume: %w", err)
	}
	if tag == "" {
		// The broker names the consumer when the client leaves it to it.
		tag = "amq.ctag-fakepeer"
	}
	if bits[3] {
		return tag, nil
	}
	return tag, s.Send(BasicConsumeOk(channel, tag))
}

// AnswerChannelAndConsume answers channel.open, then basic.consume on that
// channel: a consumer's setup, as Channel then Consume send it. It returns
// the channel and the consumer tag, which deliveries must carry.
func (s *Session) AnswerChannelAndConsume() (uint16, string, error) {
	ch, err := s.AnswerChannelOpen()
	if err != nil {
		return 0, "", err
	}
	tag, err := s.AnswerConsume(ch)
	return ch, tag, err
}

// AnswerClose answers the client's orderly shutdown: it reads frames,
// answering channel.close with channel.close-ok, until connection.close,
// which it answers with connection.close-ok. It discards every other frame
// meanwhile, such as acks of deliveries.
func (s *Session) AnswerClose() error {
	for {
		f, err := s.ReadFrame()
		if err != nil {
			return err
		}
		if done, err := s.answer(f, false); done || err != nil {
			return err
		}
	}
}

// answer gives the reply a minimal broker would give to f, if f is
// channel.open (when open is set), channel.close or connection.close. It
// reports done after answering connection.close.
func (s *Session) answer(f Frame, open bool) (done bool, err error) {
	switch c, m := f.Method(); {
	case open && c == classChannel && m == channelOpen:
		return false, s.Send(ChannelOpenOk(f.Channel))
	case c == classChannel && m == channelClose:
		return false, s.Send(ChannelCloseOk(f.Channel))
	case c == classConnection && m == connectionClose:
		return true, s.Send(ConnectionCloseOk())
	}
	return false, nil
}

// idle serves the connection after a script returned nil; see Serve. It
// reads without a deadline because the client may stay idle as long as
// the test likes; shutdown ends it by closing the connection.
func (s *Session) idle() {
	if s.stopped {
		<-s.p.done
		return
	}
	if err := s.conn.SetReadDeadline(time.Time{}); err != nil {
		return
	}
	for {
		f, err := s.readFrame()
		if err != nil {
			return
		}
		if _, err := s.answer(f, true); err != nil {
			return
		}
	}
}

func (s *Session) setDeadline(set func(time.Time) error) {
	if d := s.p.cfg.ioTimeout; d > 0 {
		_ = set(time.Now().Add(d))
	}
}

// handshake scripts the server side of the connection handshake, AMQP
// 0-9-1 section 2.2.4, without the optional secure/secure-ok exchange.
func (s *Session) handshake() error {
	s.setDeadline(s.conn.SetReadDeadline)
	var hdr [len(protocolHeader)]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		return fmt.Errorf("fakepeer: read protocol header: %w", err)
	}
	if string(hdr[:]) != protocolHeader {
		// The specification has the server answer a header it does not
		// support with the one it does, then close.
		_ = s.write([]byte(protocolHeader))
		return fmt.Errorf("fakepeer: client sent protocol header %q", hdr[:])
	}

	start := new(Args).Octet(0).Octet(9).Table(serverProperties).
		LongStr("PLAIN AMQPLAIN").LongStr("en_US")
	if err := s.Send(MethodFrame(0, classConnection, connectionStart, start.Bytes())); err != nil {
		return err
	}
	if _, err := s.ExpectMethod(0, classConnection, connectionStartOk); err != nil {
		return err
	}

	cfg := s.p.cfg
	tune := new(Args).Short(cfg.channelMax).Long(cfg.frameMax).Short(cfg.heartbeat)
	if err := s.Send(MethodFrame(0, classConnection, connectionTune, tune.Bytes())); err != nil {
		return err
	}
	f, err := s.ExpectMethod(0, classConnection, connectionTuneOk)
	if err != nil {
		return err
	}
	a := ReadArgs(f.Args())
	a.Short() // channel-max
	frameMax := a.Long()
	a.Short() // heartbeat
	if err := a.Err(); err != nil {
		return fmt.Errorf("fakepeer: connection.tune-ok: %w", err)
	}
	s.frameMax = frameMax

	if _, err := s.ExpectMethod(0, classConnection, connectionOpen); err != nil {
		return err
	}
	return s.Send(MethodFrame(0, classConnection, connectionOpenOk, new(Args).ShortStr("").Bytes()))
}
