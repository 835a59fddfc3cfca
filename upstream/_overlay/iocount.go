// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
)

// ioCounters are a connection's byte and frame counts for Stats, across
// its generations. The reader adds to the read side once per socket read
// and once per frame; writers add under the connection's write lock.
type ioCounters struct {
	bytesIn, framesIn   atomic.Uint64
	bytesOut, framesOut atomic.Uint64
	writes              atomic.Uint64 // socketWriter writes: a write or writev system call each
	coalesced           atomic.Uint64 // publishes written by another publisher (groupcommit.go)

	// Frames out are counted by following the frame boundaries of the
	// written stream: upstream's writer hands the socket bytes, not frames.
	tallyM sync.Mutex
	tally  frameTally

	settled func(SettleInfo) // the Observer's Settled hook, set before any write
}

// wrote counts p, written to the socket as part of the frame stream.
func (c *ioCounters) wrote(p []byte) {
	if len(p) == 0 {
		return
	}
	c.bytesOut.Add(uint64(len(p)))
	c.tallyM.Lock()
	n := c.tally.feed(p, c.settled)
	c.tallyM.Unlock()
	c.framesOut.Add(n)
}

// writingVectors counts the frames of v, about to be written whole:
// WriteTo consumes v's buffers, so they cannot be counted after. A write
// that fails ends the connection, so a miscount then does not matter.
func (c *ioCounters) writingVectors(v net.Buffers) {
	c.tallyM.Lock()
	var n uint64
	for _, b := range v {
		n += c.tally.feed(b, c.settled)
	}
	c.tallyM.Unlock()
	c.framesOut.Add(n)
}

// wroteBytes counts n bytes written by writingVectors' write.
func (c *ioCounters) wroteBytes(n int64) { c.bytesOut.Add(uint64(n)) }

// restart begins the stream of a new connection generation, which opens
// with the protocol header again; the last generation may have ended in
// the middle of a frame.
func (c *ioCounters) restart() {
	c.tallyM.Lock()
	c.tally = frameTally{}
	c.tallyM.Unlock()
}

// fill copies the counters into s.
func (c *ioCounters) fill(s *Stats) {
	s.BytesIn, s.FramesIn = c.bytesIn.Load(), c.framesIn.Load()
	s.BytesOut, s.FramesOut = c.bytesOut.Load(), c.framesOut.Load()
	s.Writes, s.CoalescedPublishes = c.writes.Load(), c.coalesced.Load()
}

// frameTally follows frame boundaries in a byte stream: each frame is a
// 7-byte header (type, channel, payload size), the payload and a
// frame-end octet (spec 4.2.3). While it follows them it can read the
// start of method frames: the Observer's Settled hook learns of the
// application's basic.ack, basic.nack and basic.reject there, from the
// bytes that went out, however the application sent them.
type frameTally struct {
	started bool // the stream's first byte was seen
	skip    int  // protocol header bytes still to skip

	hdr  [7]byte
	have int    // header bytes seen of the current frame
	left uint64 // payload and frame-end bytes still to skip

	want, got int              // of the payload's first bytes to keep
	args      [settleArgs]byte // class, method, delivery tag, bits
}

// settleArgs is the length of the start of a basic.ack, basic.nack or
// basic.reject payload that says everything about it: class-id and
// method-id (2 octets each), delivery-tag (8), one octet of bits.
const settleArgs = 13

// feed consumes p and returns how many frames ended in it. The protocol
// header that opens the stream ("AMQP" and four octets) is not a frame:
// it is skipped. settled, if not nil, hears of every acknowledgement in p.
func (t *frameTally) feed(p []byte, settled func(SettleInfo)) (frames uint64) {
	if !t.started && len(p) > 0 {
		t.started = true
		if p[0] == amqpHeader[0] {
			t.skip = len(amqpHeader)
		}
	}
	if t.skip > 0 {
		n := t.skip
		if len(p) < n {
			n = len(p)
		}
		p, t.skip = p[n:], t.skip-n
	}
	for len(p) > 0 {
		if t.left > 0 {
			if t.got < t.want {
				t.got += copy(t.args[t.got:t.want], p)
				if t.got == t.want {
					t.settle(settled)
				}
			}
			skip := t.left
			if uint64(len(p)) < skip {
				skip = uint64(len(p))
			}
			p = p[skip:]
			t.left -= skip
			if t.left == 0 {
				frames++
			}
			continue
		}
		n := copy(t.hdr[t.have:], p)
		t.have += n
		p = p[n:]
		if t.have == len(t.hdr) {
			t.have = 0
			size := binary.BigEndian.Uint32(t.hdr[3:7])
			t.left = uint64(size) + 1
			t.want, t.got = 0, 0
			if settled != nil && t.hdr[0] == frameMethod && size >= settleArgs {
				t.want = settleArgs
			}
		}
	}
	return frames
}

// settle reports the method whose start is in t.args, if it settles a
// delivery.
func (t *frameTally) settle(settled func(SettleInfo)) {
	if binary.BigEndian.Uint16(t.args[0:2]) != 60 { // basic
		return
	}
	info := SettleInfo{
		Channel:     binary.BigEndian.Uint16(t.hdr[1:3]),
		DeliveryTag: binary.BigEndian.Uint64(t.args[4:12]),
	}
	bits := t.args[12]
	switch binary.BigEndian.Uint16(t.args[2:4]) {
	case 80: // basic.ack
		info.Kind, info.Multiple = SettleAck, bits&1 != 0
	case 120: // basic.nack
		info.Kind, info.Multiple, info.Requeue = SettleNack, bits&1 != 0, bits&2 != 0
	case 90: // basic.reject
		info.Kind, info.Requeue = SettleReject, bits&1 != 0
	default:
		return
	}
	settled(info)
}

// amqpHeader opens every connection's stream (spec 4.2.2).
var amqpHeader = [8]byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}
