// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"sync/atomic"
	"testing"
)

// rawFrame encodes one frame the way the wire carries it.
func rawFrame(typ byte, channel uint16, payload []byte) []byte {
	b := []byte{typ, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(b[1:3], channel)
	binary.BigEndian.PutUint32(b[3:7], uint32(len(payload)))
	b = append(b, payload...)
	return append(b, frameEnd)
}

// chunkReader returns its chunks one Read at a time, and a deadline error
// between chunks when timeouts is set, like a socket whose read deadline
// expires in the middle of a frame.
type chunkReader struct {
	chunks   [][]byte
	timeouts bool
	timedOut bool
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	if r.timeouts && !r.timedOut {
		r.timedOut = true
		return 0, os.ErrDeadlineExceeded
	}
	r.timedOut = false
	n := copy(p, r.chunks[0])
	if r.chunks[0] = r.chunks[0][n:]; len(r.chunks[0]) == 0 {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}

// split cuts stream into pieces whose lengths come from sizes (0 means 1),
// cycling through sizes.
func split(stream, sizes []byte) [][]byte {
	if len(sizes) == 0 {
		return [][]byte{stream}
	}
	var out [][]byte
	for i := 0; len(stream) > 0; i++ {
		n := int(sizes[i%len(sizes)])
		if n == 0 {
			n = 1
		}
		if n > len(stream) {
			n = len(stream)
		}
		out = append(out, stream[:n])
		stream = stream[n:]
	}
	return out
}

// splitAll runs a splitter over r until r or the splitter fails, returning
// copies of the frames and the first non-timeout error.
func splitAll(r io.Reader, max uint32) (frames [][]byte, largestBuf int, err error) {
	var limit atomic.Uint32
	limit.Store(max)
	s := newFrameSplitter(&limit)
	for {
		for {
			raw, err := s.next()
			if err != nil {
				return frames, len(s.buf), err
			}
			if raw == nil {
				break
			}
			frames = append(frames, append([]byte(nil), raw...))
		}
		if _, err := s.fill(r); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			if len(s.buf) > largestBuf {
				largestBuf = len(s.buf)
			}
			return frames, largestBuf, err
		}
		if len(s.buf) > largestBuf {
			largestBuf = len(s.buf)
		}
	}
}

func TestFrameSplitterKeepsPartialFramesAcrossTimeouts(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 131072-frameHeaderSize)
	stream := bytes.Join([][]byte{
		rawFrame(frameHeartbeat, 0, nil),
		rawFrame(frameMethod, 1, []byte{0, 60, 0, 60, 1, 2, 3}),
		rawFrame(frameBody, 1, body),
		rawFrame(frameHeartbeat, 0, nil),
	}, nil)
	r := &chunkReader{chunks: split(stream, []byte{200, 3, 1, 255}), timeouts: true}

	frames, _, err := splitAll(r, 131072)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("splitAll ended with %v, want io.EOF", err)
	}
	if got := bytes.Join(frames, nil); !bytes.Equal(got, stream) {
		t.Fatalf("frames do not reassemble the stream: %d frames, %d of %d bytes", len(frames), len(got), len(stream))
	}
	if len(frames) != 4 {
		t.Fatalf("got %d frames, want 4", len(frames))
	}
}

func TestFrameSplitterRefusesOversizedFrameBeforeBuffering(t *testing.T) {
	header := []byte{frameBody, 0, 1, 0x7f, 0xff, 0xff, 0xff} // claims 2 GiB
	frames, largest, err := splitAll(&chunkReader{chunks: [][]byte{header}}, 131072)
	if len(frames) != 0 || !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("splitAll = %d frames, %v; want ErrFrameTooLarge", len(frames), err)
	}
	if largest > frameMinSize {
		t.Fatalf("the splitter grew its buffer to %d bytes for a refused frame", largest)
	}
	if want := "exceeds the frame maximum of 131072 bytes"; !bytes.Contains([]byte(err.Error()), []byte(want)) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

func TestFrameSplitterRefusesMalformedFrames(t *testing.T) {
	good := rawFrame(frameMethod, 0, []byte{0, 10, 0, 41})
	badEnd := append(append([]byte(nil), good[:len(good)-1]...), 0x00)
	badType := append([]byte{42}, good[1:]...)
	for name, stream := range map[string][]byte{"frame-end": badEnd, "type": badType} {
		frames, _, err := splitAll(&chunkReader{chunks: [][]byte{stream}}, 131072)
		if len(frames) != 0 || !errors.Is(err, ErrFrame) {
			t.Errorf("bad %s: splitAll = %d frames, %v; want ErrFrame", name, len(frames), err)
		}
	}
}

// FuzzFrameSplitter checks that how the stream is sliced never changes what
// comes out: the same frames, byte for byte, and the same verdict at the
// end; that garbage gives a frame error and never a panic; and that the
// buffer never outgrows the frame maximum.
func FuzzFrameSplitter(f *testing.F) {
	f.Add(rawFrame(frameHeartbeat, 0, nil), []byte{1})
	f.Add(bytes.Join([][]byte{
		rawFrame(frameMethod, 1, []byte{0, 60, 0, 60}),
		rawFrame(frameHeader, 1, make([]byte, 14)),
		rawFrame(frameBody, 1, []byte("hello")),
	}, nil), []byte{7, 1, 3})
	f.Add([]byte{frameBody, 0, 1, 0xff, 0xff, 0xff, 0xff}, []byte{2})
	f.Add([]byte("AMQP\x00\x00\x09\x01"), []byte{3})
	f.Add(append(rawFrame(frameBody, 1, bytes.Repeat([]byte{1}, 5000)), 0xce), []byte{255, 17})

	const max = 8192
	f.Fuzz(func(t *testing.T, stream, sizes []byte) {
		whole, _, wholeErr := splitAll(bytes.NewReader(stream), max)
		sliced, largest, slicedErr := splitAll(&chunkReader{chunks: split(stream, sizes), timeouts: true}, max)

		if len(whole) != len(sliced) {
			t.Fatalf("%d frames whole, %d sliced", len(whole), len(sliced))
		}
		for i := range whole {
			if !bytes.Equal(whole[i], sliced[i]) {
				t.Fatalf("frame %d differs between whole and sliced reads", i)
			}
		}
		if errors.Is(wholeErr, io.EOF) != errors.Is(slicedErr, io.EOF) ||
			errors.Is(wholeErr, ErrFrame) != errors.Is(slicedErr, ErrFrame) ||
			errors.Is(wholeErr, ErrFrameTooLarge) != errors.Is(slicedErr, ErrFrameTooLarge) {
			t.Fatalf("verdicts differ: whole %v, sliced %v", wholeErr, slicedErr)
		}
		if !errors.Is(slicedErr, io.EOF) && !errors.Is(slicedErr, ErrFrame) && !errors.Is(slicedErr, ErrFrameTooLarge) {
			t.Fatalf("unexpected error kind: %v", slicedErr)
		}
		if largest > max && largest > frameMinSize {
			t.Fatalf("buffer grew to %d bytes, over the %d-byte frame maximum", largest, max)
		}
		for _, fr := range sliced {
			// Method, header and heartbeat payloads can be malformed inside
			// a well-framed frame: the parser's error then closes the
			// connection. A body frame's payload is opaque and always parses.
			if _, err := (&reader{r: bytes.NewReader(fr)}).ReadFrame(); err != nil && fr[0] == frameBody {
				t.Fatalf("a body frame the splitter accepted does not parse: %v", err)
			}
		}
	})
}
