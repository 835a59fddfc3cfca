package fakepeer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// Frame is one frame as the client sent it. Payload excludes the 7-octet
// frame header and the frame-end octet.
type Frame struct {
	Type    uint8
	Channel uint16
	Payload []byte
}

// Method returns the class and method IDs of a method frame, and 0, 0 for
// any other frame.
func (f Frame) Method() (classID, methodID uint16) {
	if f.Type != FrameMethod || len(f.Payload) < 4 {
		return 0, 0
	}
	return binary.BigEndian.Uint16(f.Payload), binary.BigEndian.Uint16(f.Payload[2:])
}

// Args returns the arguments of a method frame, for ReadArgs, and nil for
// any other frame.
func (f Frame) Args() []byte {
	if f.Type != FrameMethod || len(f.Payload) < 4 {
		return nil
	}
	return f.Payload[4:]
}

// String describes the frame for failure messages, e.g.
// "method 60.20 on channel 1".
func (f Frame) String() string {
	switch f.Type {
	case FrameMethod:
		c, m := f.Method()
		return fmt.Sprintf("method %d.%d on channel %d", c, m, f.Channel)
	case FrameHeader:
		return fmt.Sprintf("content header on channel %d", f.Channel)
	case FrameBody:
		return fmt.Sprintf("content body of %d octets on channel %d", len(f.Payload), f.Channel)
	case FrameHeartbeat:
		return fmt.Sprintf("heartbeat on channel %d", f.Channel)
	}
	return fmt.Sprintf("frame of type %d on channel %d", f.Type, f.Channel)
}

// errShortArgs is the sticky error of an ArgReader that ran out of octets.
var errShortArgs = errors.New("fakepeer: arguments end early")

// ArgReader decodes the arguments of a method the client sent, field by
// field, in order. Like bufio.Scanner it keeps the first error: once a read
// fails every later read returns a zero value, so a script can read all
// fields and check Err once.
type ArgReader struct {
	b   []byte
	err error
}

// ReadArgs returns an ArgReader over b, usually Frame.Args.
func ReadArgs(b []byte) *ArgReader { return &ArgReader{b: b} }

// Err returns the first error met, or nil.
func (r *ArgReader) Err() error { return r.err }

// Rest returns the octets not read yet.
func (r *ArgReader) Rest() []byte { return r.b }

func (r *ArgReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = errShortArgs
		r.b = nil
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// Octet reads one octet.
func (r *ArgReader) Octet() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

// Short reads a 16-bit big-endian integer.
func (r *ArgReader) Short() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

// Long reads a 32-bit big-endian integer.
func (r *ArgReader) Long() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

// LongLong reads a 64-bit big-endian integer.
func (r *ArgReader) LongLong() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// ShortStr reads a short string.
func (r *ArgReader) ShortStr() string {
	return string(r.take(int(r.Octet())))
}

// LongStr reads a long string.
func (r *ArgReader) LongStr() string {
	n := r.Long()
	if uint64(n) > uint64(len(r.b)) {
		r.take(len(r.b) + 1) // records errShortArgs
		return ""
	}
	return string(r.take(int(n)))
}

// Bits reads n adjacent bit arguments, packed as Args.Bits packs them.
func (r *ArgReader) Bits(n int) []bool {
	v := make([]bool, n)
	for i := 0; i < n; i += 8 {
		o := r.Octet()
		for j := 0; j < 8 && i+j < n; j++ {
			v[i+j] = o&(1<<j) != 0
		}
	}
	return v
}

// Table reads a field table into the value types listed at Table. A
// decimal field ('D') or any unknown field type is an error.
func (r *ArgReader) Table() Table {
	size := r.Long()
	if uint64(size) > uint64(len(r.b)) {
		r.take(len(r.b) + 1)
		return nil
	}
	sub := &ArgReader{b: r.take(int(size))}
	t := Table{}
	for sub.err == nil && len(sub.b) > 0 {
		k := sub.ShortStr()
		t[k] = sub.field()
	}
	if sub.err != nil && r.err == nil {
		r.err = sub.err
	}
	return t
}

func (r *ArgReader) field() any {
	typ := r.Octet()
	if r.err != nil {
		return nil
	}
	switch typ {
	case 't':
		return r.Octet() != 0
	case 'b':
		return int8(r.Octet())
	case 'B':
		return r.Octet()
	case 's':
		return int16(r.Short())
	case 'u':
		return r.Short()
	case 'I':
		return int32(r.Long())
	case 'i':
		return r.Long()
	case 'l':
		return int64(r.LongLong())
	case 'f':
		return math.Float32frombits(r.Long())
	case 'd':
		return math.Float64frombits(r.LongLong())
	case 'S':
		return r.LongStr()
	case 'x':
		return []byte(r.LongStr())
	case 'T':
		return time.Unix(int64(r.LongLong()), 0)
	case 'F':
		return r.Table()
	case 'A':
		size := r.Long()
		if uint64(size) > uint64(len(r.b)) {
			r.take(len(r.b) + 1)
			return nil
		}
		sub := &ArgReader{b: r.take(int(size))}
		a := []any{}
		for sub.err == nil && len(sub.b) > 0 {
			a = append(a, sub.field())
		}
		if sub.err != nil && r.err == nil {
			r.err = sub.err
		}
		return a
	case 'V':
		return nil
	}
	r.err = fmt.Errorf("fakepeer: unsupported table field type %q", typ)
	return nil
}
