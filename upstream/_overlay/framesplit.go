// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

const (
	maxUnlimitedFrame = 64 << 20 // bounds a frame when frame_max is 0 (a header may claim 4 GiB)
	readAhead         = 64 << 10 // caps the read size a streaming connection earns (fill)
)

// frameSplitter cuts a byte stream into AMQP frames (spec 2.3.5). Owning its buffer, it loses
// nothing to a read timing out mid-frame; a bad header is refused before buffering its payload.
type frameSplitter struct {
	buf        []byte
	start, end int            // buf[start:end] is read but not yet returned
	maxFrame   *atomic.Uint32 // negotiated frame_max (header+payload+end), 0 for none
	ahead      int            // the buffer size reads have earned (fill)
	raw        bytes.Reader   // parse's, reset onto each frame
	parser     reader
	counts     *ioCounters // the connection's Stats counters, or nil
	frames     uint64      // frames returned and not yet added to counts
}

func newFrameSplitter(maxFrame *atomic.Uint32) *frameSplitter {
	s := &frameSplitter{buf: make([]byte, frameMinSize), maxFrame: maxFrame}
	s.parser.r = &s.raw
	return s
}

// parse parses raw, a frame from next; the result never aliases raw.
func (s *frameSplitter) parse(raw []byte) (frame, error) {
	s.raw.Reset(raw)
	return s.parser.ReadFrame()
}

// frameError is a bad frame, wrapping ErrFrame or ErrFrameTooLarge.
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

// next returns the next whole frame, or nil; it aliases the buffer until the next fill.
func (s *frameSplitter) next() ([]byte, error) {
	if avail := s.buf[s.start:s.end]; len(avail) >= 7 {
		typ, size := avail[0], binary.BigEndian.Uint32(avail[3:7])
		if typ != frameMethod && typ != frameHeader && typ != frameBody && typ != frameHeartbeat {
			return nil, &frameError{fmt.Sprintf("invalid frame type %d", typ), ErrFrame}
		}
		if limit := s.limit(); uint64(size)+frameHeaderSize > uint64(limit) {
			return nil, &frameError{fmt.Sprintf("frame of %d payload bytes exceeds the frame maximum of %d bytes", size, limit), ErrFrameTooLarge}
		}
		if total := int(size) + frameHeaderSize; len(avail) >= total {
			if end := avail[total-1]; end != frameEnd {
				return nil, &frameError{fmt.Sprintf("frame-end octet is %#x, want %#x", end, frameEnd), ErrFrame}
			}
			s.start += total
			s.frames++
			return avail[:total:total], nil
		}
	}
	if s.counts != nil && s.frames > 0 { // no whole frame left: count the batch at once
		s.counts.framesIn.Add(s.frames)
		s.frames = 0
	}
	return nil, nil
}

// fill reads once from r, after making room for the rest of the current
// frame. Call it only after next returned nil (so need is within limit).
func (s *frameSplitter) fill(r io.Reader) (int, error) {
	need := 7 // a header, then the whole frame
	if avail := s.buf[s.start:s.end]; len(avail) >= 7 {
		need = int(binary.BigEndian.Uint32(avail[3:7])) + frameHeaderSize
	}
	if s.start > 0 && s.start == s.end {
		s.start, s.end = 0, 0
	}
	size := max(need, s.ahead)
	if len(s.buf) < size || len(s.buf)-s.start < need {
		buf := s.buf // the partial frame moves to the front
		if len(buf) < size {
			buf = make([]byte, size)
		}
		s.end, s.start, s.buf = copy(buf, s.buf[s.start:s.end]), 0, buf
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
		ahead := min(2*len(s.buf), readAhead)
		if limit := s.limit(); ahead > limit {
			ahead = limit
		}
		s.ahead = max(s.ahead, ahead)
	}
	return n, err
}
