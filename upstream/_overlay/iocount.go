// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
)

// ioCounters are a connection's byte and frame counts for Stats, across generations. The
// frame splitter counts what comes in; the socket writers count what goes out, frames
// included, by following the frame boundaries in the written bytes (frameTally), since a
// write need not hold whole frames: upstream's bufio.Writer flushes wherever it fills.
// The counts are atomics, read by Stats without a lock. tallyM guards the tally: upstream's
// flush writes without c.sendM, so one write may run beside another that holds it.
type ioCounters struct {
	bytesIn, framesIn   atomic.Uint64
	bytesOut, framesOut atomic.Uint64
	writes              atomic.Uint64    // socketWriter writes: a write or writev system call each
	coalesced           atomic.Uint64    // publishes written by another publisher (groupcommit.go)
	tallyM              sync.Mutex       // guards tally
	tally               frameTally       // frames out
	settled             func(SettleInfo) // the Observer's Settled hook, set before any write
}

// wrote counts p, written to the socket as part of the frame stream: called after the write
// with what it wrote, so the bytes are exact and a frame counts once its last byte went out.
func (c *ioCounters) wrote(p []byte) {
	c.bytesOut.Add(uint64(len(p)))
	c.writingVectors(net.Buffers{p})
}

// writingVectors counts v's frames before the write that consumes v (writev leaves v empty).
// A failed write is counted whole: it ends the connection, so the count is not read again
// for that stream.
func (c *ioCounters) writingVectors(v net.Buffers) {
	c.tallyM.Lock()
	var n uint64
	for _, b := range v {
		n += c.tally.feed(b, c.settled)
	}
	c.tallyM.Unlock()
	c.framesOut.Add(n)
}

// restart begins a new generation's stream, which opens with the protocol header again.
// readBase.install calls it under c.sendM, before the new socket's first write; a frame left
// half-counted on the old socket is forgotten with the old stream.
func (c *ioCounters) restart() {
	c.tallyM.Lock()
	c.tally = frameTally{}
	c.tallyM.Unlock()
}

// fill copies the counters into s.
func (c *ioCounters) fill(s *Stats) {
	s.BytesIn = c.bytesIn.Load()
	s.FramesIn = c.framesIn.Load()
	s.BytesOut = c.bytesOut.Load()
	s.FramesOut = c.framesOut.Load()
	s.Writes = c.writes.Load()
	s.CoalescedPublishes = c.coalesced.Load()
}

// frameTally follows a byte stream's frame boundaries (spec 4.2.3) and reads method frames'
// starts, so the Observer's Settled hears of every basic.ack, nack and reject, however sent:
// by Channel.Ack, Delivery.Ack, a multiple ack, or the group commit, with no hook in
// upstream's Channel. It keeps its state between writes, since a frame may span several.
type frameTally struct {
	started   bool             // the stream's first byte was seen
	skip      int              // protocol header bytes still to skip
	hdr       [7]byte          // type, channel, payload size
	have      int              // header bytes seen of the current frame
	left      uint64           // payload and frame-end bytes still to skip
	want, got int              // of the payload's first bytes to keep
	args      [settleArgs]byte // class, method, delivery tag, bits
}

const settleArgs = 13 // an ack, nack or reject's class and method ids (2 each), tag (8), bits (1)

// feed consumes p, after the protocol header that opens the stream, and returns how many
// frames ended in it; settled, if not nil, hears of every acknowledgement in p. It alternates
// two states: collecting a frame's 7-byte header (have), then skipping its payload and
// frame-end (left), keeping the payload's first settleArgs bytes of a method frame (want,
// got) to decode a settlement from once they are all there.
func (t *frameTally) feed(p []byte, settled func(SettleInfo)) (frames uint64) {
	// A generation's stream opens with the protocol header, which is not a frame: skip it
	// if the first byte says so (a test's stream may start with a frame).
	if !t.started && len(p) > 0 {
		t.started = true
		if p[0] == amqpHeader[0] {
			t.skip = len(amqpHeader)
		}
	}
	n := min(t.skip, len(p)) // upstream's int min
	t.skip -= n
	p = p[n:]
	for len(p) > 0 {
		if t.left > 0 {
			// Inside a payload: keep its first bytes if wanted (they may arrive over
			// several writes), then skip to the frame's end.
			if t.got < t.want {
				t.got += copy(t.args[t.got:t.want], p)
				if t.got == t.want {
					t.settle(settled)
				}
			}
			if uint64(len(p)) < t.left {
				t.left -= uint64(len(p))
				break
			}
			p = p[t.left:] // the frame ends in p
			t.left = 0
			frames++
			continue
		}
		n := copy(t.hdr[t.have:], p)
		t.have += n
		p = p[n:]
		if t.have == len(t.hdr) { // a whole header: the payload and frame-end follow
			t.have = 0
			size := binary.BigEndian.Uint32(t.hdr[3:7])
			t.left = uint64(size) + 1
			t.want = 0
			t.got = 0
			if settled != nil && t.hdr[0] == frameMethod && size >= settleArgs {
				t.want = settleArgs
			}
		}
	}
	return frames
}

// settle reports the method in t.args if it settles a delivery. The three methods share a
// layout: class and method ids, a 64-bit delivery tag, then one octet of bits (multiple and
// requeue for nack; requeue alone for reject; multiple alone for ack).
func (t *frameTally) settle(settled func(SettleInfo)) {
	m, ok := settleMethods[binary.BigEndian.Uint16(t.args[2:4])]
	if !ok || binary.BigEndian.Uint16(t.args[0:2]) != 60 { // basic
		return
	}
	bits := t.args[12]
	settled(SettleInfo{Kind: m.kind, Channel: binary.BigEndian.Uint16(t.hdr[1:3]),
		DeliveryTag: binary.BigEndian.Uint64(t.args[4:12]), Multiple: bits&m.multiple != 0,
		Requeue: bits&m.requeue != 0})
}

// settleMethods are the basic class's settling methods by method id: their kind, and which bit
// of their last octet says multiple and which requeue (0: the method has no such bit).
var settleMethods = map[uint16]struct {
	kind              SettleKind
	multiple, requeue byte
}{
	80:  {SettleAck, 1, 0},    // basic.ack
	120: {SettleNack, 1, 2},   // basic.nack
	90:  {SettleReject, 0, 1}, // basic.reject
}

// amqpHeader opens every connection's stream (spec 4.2.2).
var amqpHeader = [8]byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}
