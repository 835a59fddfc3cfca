// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

const (
	// maxUnlimitedFrame bounds a frame when frame_max is 0 (no limit negotiated): a header may
	// claim 4 GiB, and the splitter buffers a whole frame before returning it.
	maxUnlimitedFrame = 64 << 20
	// readAhead caps the read size a streaming connection earns (fill).
	readAhead = 64 << 10
)

// frameSplitter cuts a byte stream into AMQP frames (spec 2.3.5). Upstream reads a frame with
// several small reads from a bufio.Reader; the splitter instead reads as much as the socket has
// into a buffer of its own and returns whole frames from it, so one read serves many frames.
//
// Owning its buffer, it loses nothing to a read timing out mid-frame: the partial frame stays
// buffered for the next read, which is what lets a read deadline serve as the heartbeat timer
// and a lessee's read be capped (readStep). A frame's header is checked (type, size against
// frame_max) before its payload is buffered, so a bad peer cannot make it allocate 4 GiB.
//
// Like the contentReader, a splitter belongs to its generation's read turn (fastread.go): only
// the holder calls next and fill. The frames next returns alias the buffer until the next fill.
type frameSplitter struct {
	buf        []byte
	start, end int            // buf[start:end] is read but not yet returned
	maxFrame   *atomic.Uint32 // negotiated frame_max (header+payload+end), 0 for none
	ahead      int            // the buffer size reads have earned (fill)
	raw        bytes.Reader   // parse's, reset onto each frame
	parser     reader         // upstream's, reading from raw: one frame at a time
	counts     *ioCounters    // the connection's Stats counters, or nil
	frames     uint64         // frames returned and not yet added to counts
}

// newFrameSplitter returns a splitter bounded by maxFrame, the connection's frame_max, which
// tune sets after the first frames were read (hence a pointer, loaded per frame).
func newFrameSplitter(maxFrame *atomic.Uint32) *frameSplitter {
	s := &frameSplitter{buf: make([]byte, frameMinSize), maxFrame: maxFrame}
	s.parser.r = &s.raw
	return s
}

// parse parses raw, a frame from next, with upstream's parser; the result never aliases raw,
// so it may outlive the next fill.
func (s *frameSplitter) parse(raw []byte) (frame, error) {
	s.raw.Reset(raw)
	return s.parser.ReadFrame()
}

// frameError is a bad frame, wrapping ErrFrame or ErrFrameTooLarge as upstream's reader
// returns them, with a reason for the connection's close error.
type frameError struct {
	reason string
	err    error
}

func (e *frameError) Error() string { return e.reason }
func (e *frameError) Unwrap() error { return e.err }

// limit is the largest frame, header and frame-end included, accepted now.
func (s *frameSplitter) limit() int {
	return cmp.Or(int(s.maxFrame.Load()), maxUnlimitedFrame)
}

// next returns the next whole frame, or nil when none is buffered; the frame aliases the buffer
// until the next fill. A frame is returned only once its frame-end octet is checked, so the
// decoders after it may take the payload as raw[7:len(raw)-1].
func (s *frameSplitter) next() ([]byte, error) {
	if avail := s.buf[s.start:s.end]; len(avail) >= 7 {
		typ := avail[0]
		size := binary.BigEndian.Uint32(avail[3:7])
		switch typ {
		case frameMethod, frameHeader, frameBody, frameHeartbeat:
		default:
			return nil, &frameError{fmt.Sprintf("invalid frame type %d", typ), ErrFrame}
		}
		if limit := s.limit(); uint64(size)+frameHeaderSize > uint64(limit) {
			reason := fmt.Sprintf("frame of %d payload bytes exceeds the frame maximum of %d bytes",
				size, limit)
			return nil, &frameError{reason, ErrFrameTooLarge}
		}
		if total := int(size) + frameHeaderSize; len(avail) >= total {
			if end := avail[total-1]; end != frameEnd {
				reason := fmt.Sprintf("frame-end octet is %#x, want %#x", end, frameEnd)
				return nil, &frameError{reason, ErrFrame}
			}
			s.start += total
			s.frames++
			return avail[:total:total], nil
		}
	}
	// No whole frame left: count the batch at once, one atomic add a read, not one a frame.
	if s.counts != nil && s.frames > 0 {
		s.counts.framesIn.Add(s.frames)
		s.frames = 0
	}
	return nil, nil
}

// fill reads once from r, after making room for the rest of the current frame. Call it only
// after next returned nil, so that the frame's size was checked against the limit before the
// buffer grows for it.
//
// The buffer grows with the traffic: a read that fills it doubles the read-ahead, up to
// readAhead, so a streaming connection reads 64 KiB at a time, while an idle one, whose reads
// never fill the buffer, keeps a small one.
func (s *frameSplitter) fill(r io.Reader) (int, error) {
	need := 7 // a header, then the whole frame
	if avail := s.buf[s.start:s.end]; len(avail) >= 7 {
		need = int(binary.BigEndian.Uint32(avail[3:7])) + frameHeaderSize
	}
	if s.start > 0 && s.start == s.end { // all returned: read from the front again
		s.start = 0
		s.end = 0
	}
	size := max(need, s.ahead)
	if len(s.buf) < size || len(s.buf)-s.start < need {
		buf := s.buf // the partial frame moves to the front
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
		// More is waiting: double the read-ahead (an idle connection never).
		ahead := min(min(2*len(s.buf), readAhead), s.limit())
		s.ahead = max(s.ahead, ahead)
	}
	return n, err
}
