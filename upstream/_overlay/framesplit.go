// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// maxUnlimitedFrame bounds one frame when the peers negotiated no frame
// maximum (frame_max 0). A frame header may claim up to 4 GiB; without a
// bound, one forged header would make the splitter buffer that much.
const maxUnlimitedFrame = 64 << 20

// readAhead is the most the splitter asks for per read, once reads keep
// filling its buffer (capped by the frame maximum): large enough that one
// read carries many small deliveries, small enough to cost little per
// streaming connection.
const readAhead = 64 << 10

// frameSplitter cuts a byte stream into complete AMQP frames (spec 2.3.5:
// type, channel, size, payload, frame-end).
//
// It differs from upstream's reader in one way that matters to a read loop
// with deadlines: it owns its buffer, so a read that times out in the middle
// of a frame loses nothing. The bytes stay buffered and the next fill
// completes the frame. It validates each frame's header as soon as the
// header is complete, before buffering the payload, so an oversized or
// malformed frame is refused without allocating for it.
type frameSplitter struct {
	buf        []byte         // buf[start:end] is read but not yet returned
	start, end int            //
	maxFrame   *atomic.Uint32 // negotiated frame_max (header+payload+end), 0 for none
	// ahead is the buffer size that reads have earned: it doubles, up to
	// readAhead, each time a read fills the buffer, so only a connection
	// that streams pays for a large buffer.
	ahead int

	// raw and parser parse what next returns, reset onto each frame
	// rather than allocated per frame: the drainer and legacy modes parse
	// every frame they read.
	raw    bytes.Reader
	parser reader

	counts *ioCounters // the connection's Stats counters, or nil
	frames uint64      // frames returned and not yet added to counts
}

func newFrameSplitter(maxFrame *atomic.Uint32) *frameSplitter {
	s := &frameSplitter{buf: make([]byte, frameMinSize), maxFrame: maxFrame}
	s.parser.r = &s.raw
	return s
}

// parse parses raw, a frame that next returned. The parsed frame owns
// copies of what it keeps, never raw itself, so raw's bytes may be reused.
func (s *frameSplitter) parse(raw []byte) (frame, error) {
	s.raw.Reset(raw)
	return s.parser.ReadFrame()
}

// frameError is a malformed or oversized frame. It wraps ErrFrame or
// ErrFrameTooLarge so errors.Is keeps working, and its reason says what was
// wrong and where.
type frameError struct {
	reason string
	err    error
}

func (e *frameError) Error() string { return e.reason }
func (e *frameError) Unwrap() error { return e.err }

// limit is the largest frame, header and frame-end included, accepted now.
func (s *frameSplitter) limit() int {
	if max := s.maxFrame.Load(); max > 0 {
		return int(max)
	}
	return maxUnlimitedFrame
}

// next returns the next complete frame, header and frame-end included, or
// nil when the buffer does not hold a whole frame yet. The returned slice
// aliases the splitter's buffer and is valid until the next fill.
func (s *frameSplitter) next() ([]byte, error) {
	avail := s.buf[s.start:s.end]
	if len(avail) < 7 {
		s.countFrames()
		return nil, nil
	}
	typ, size := avail[0], binary.BigEndian.Uint32(avail[3:7])
	switch typ {
	case frameMethod, frameHeader, frameBody, frameHeartbeat:
	default:
		return nil, &frameError{fmt.Sprintf("invalid frame type %d", typ), ErrFrame}
	}
	limit := s.limit()
	if uint64(size)+frameHeaderSize > uint64(limit) {
		return nil, &frameError{
			fmt.Sprintf("frame of %d payload bytes exceeds the frame maximum of %d bytes", size, limit),
			ErrFrameTooLarge,
		}
	}
	total := int(size) + frameHeaderSize
	if len(avail) < total {
		s.countFrames()
		return nil, nil
	}
	if end := avail[total-1]; end != frameEnd {
		return nil, &frameError{fmt.Sprintf("frame-end octet is %#x, want %#x", end, frameEnd), ErrFrame}
	}
	s.start += total
	s.frames++
	return avail[:total:total], nil
}

// countFrames adds the frames returned since the last call to the
// connection's counters: once per batch (when the buffer holds no whole
// frame more), not once per frame, on the read loop.
func (s *frameSplitter) countFrames() {
	if s.counts != nil && s.frames > 0 {
		s.counts.framesIn.Add(s.frames)
		s.frames = 0
	}
}

// need is how many bytes the buffer must hold for the frame being read to
// be complete: at least a header, and the whole frame once the header says
// how long it is.
func (s *frameSplitter) need() int {
	avail := s.buf[s.start:s.end]
	if len(avail) < 7 {
		return 7
	}
	return int(binary.BigEndian.Uint32(avail[3:7])) + frameHeaderSize
}

// fill reads once from r, after making room for at least the rest of the
// current frame. It returns what r.Read returned. Call it only after next
// returned nil, so that need is within the limit that next checked.
func (s *frameSplitter) fill(r io.Reader) (int, error) {
	need := s.need()
	if s.start > 0 && s.start == s.end {
		s.start, s.end = 0, 0
	}
	size := need
	if s.ahead > size {
		size = s.ahead
	}
	if len(s.buf) < size || len(s.buf)-s.start < need {
		// Move the partial frame to the front, growing the buffer only up
		// to the read-ahead or the frame itself: memory stays bounded by
		// that or the largest frame the peer was allowed to send.
		buf := s.buf
		if len(buf) < size {
			buf = make([]byte, size)
		}
		s.end = copy(buf, s.buf[s.start:s.end])
		s.start = 0
		s.buf = buf
	}
	if s.end == len(s.buf) {
		return 0, errors.New("frameSplitter: fill called with a complete frame buffered")
	}
	n, err := r.Read(s.buf[s.end:])
	s.end += n
	if s.counts != nil && n > 0 {
		s.counts.bytesIn.Add(uint64(n))
	}
	if s.end == len(s.buf) && len(s.buf) < readAhead {
		// The read filled the buffer, so more is probably waiting: read
		// more at a time from now on, up to readAhead (and the frame
		// maximum). One read per few frames, and in legacy mode one
		// DrainEvents turn per few frames, costs more than the frames;
		// a connection that never streams keeps its small buffer.
		ahead := 2 * len(s.buf)
		if ahead > readAhead {
			ahead = readAhead
		}
		if limit := s.limit(); ahead > limit {
			ahead = limit
		}
		if ahead > s.ahead {
			s.ahead = ahead
		}
	}
	return n, err
}
