package connfuzz

import (
	"bytes"
	"encoding/binary"

	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// maxMultipleTag is the largest delivery tag FuzzConnection lets a
// basic.ack or basic.nack with the multiple flag carry in upstream and
// legacy mode.
//
// There such a confirm settles every tag from the next one expected up to
// its own, one Confirmation at a time, whether or not anything was
// published under those tags: upstream's confirms.Multiple notifies the
// listeners once per tag. A tag the fuzzer makes up, say 2^40, therefore
// spins the reader for weeks. That is a finding, not noise (see
// TestAckMultipleIsLinearInTheTag, which pins the behaviour at a small
// tag), but left in the fuzzer it would be the only thing the fuzzer ever
// reports. With the cap, the loop is a few thousand iterations at most,
// and everything else about these frames is still fuzzed. Drainer mode
// settles only published tags (it ran out of memory on such a tag before),
// so its inputs keep their tags.
const maxMultipleTag = 1 << 12

// ackIDs and nackIDs are the class and method IDs that open the payload
// of basic.ack and basic.nack. Both methods' arguments are the delivery
// tag (8 octets) and an octet of bits whose lowest is multiple.
var (
	ackIDs  = []byte{0, classBasic, 0, methodAck}
	nackIDs = []byte{0, classBasic, 0, methodNack}
)

// ackArgsLen is the length of those IDs plus the arguments.
const ackArgsLen = methodArgsBase + 8 + 1

// boundAckMultiple returns stream with the delivery tag lowered to
// maxMultipleTag wherever the client could read a basic.ack or basic.nack
// with multiple set and a higher tag. stream itself is left as the fuzzer
// made it.
//
// It looks at every offset, not at frame boundaries, because the readers
// do not agree on them: upstream's reader takes a method's arguments
// straight off the stream whatever the frame's size field says (the
// fuzzer found a 21-octet stream whose method frame claims 12301 octets,
// read by upstream as a complete basic.nack), while the frame splitter of
// drainer and legacy mode honours the size. Whatever the framing, a
// method's IDs are followed at once by its arguments, so no reading of
// the stream can find an ack that the scan misses.
//
// The peer's connection.close-ok may follow the stream (endGraceful) and
// complete an ack the stream leaves unfinished, so the scan looks at the
// stream followed by close-ok. Its octets cannot be rewritten, and need
// not be: wherever such an ack starts, its bits octet falls on an
// even octet of close-ok, so multiple is never set there.
func boundAckMultiple(stream []byte) []byte {
	out := append(bytes.Clone(stream), fakepeer.ConnectionCloseOk()...)
	for at := 0; at < len(stream); at++ {
		p := out[at:]
		if len(p) < ackArgsLen || !(bytes.HasPrefix(p, ackIDs) || bytes.HasPrefix(p, nackIDs)) {
			continue
		}
		if p[ackArgsLen-1]&1 == 0 || binary.BigEndian.Uint64(p[methodArgsBase:]) <= maxMultipleTag {
			continue
		}
		binary.BigEndian.PutUint64(p[methodArgsBase:], maxMultipleTag)
	}
	return out[:len(stream):len(stream)]
}

// blockedIDs and unblockedIDs are the class and method IDs that open the
// payload of connection.blocked and connection.unblocked.
var (
	blockedIDs   = []byte{0, 10, 0, 60}
	unblockedIDs = []byte{0, 10, 0, 61}
)

// mayCarryBlocked reports whether the client could read a
// connection.blocked or connection.unblocked anywhere in stream. Upstream
// mode can crash on those when the connection shuts down at the same time
// (TestBlockedNotificationRacesShutdown): an upstream bug that upstream
// mode must keep, so FuzzConnection skips such inputs in that mode only.
// Like boundAckMultiple it looks at every offset, whatever the framing;
// the close-ok that may follow the stream cannot complete either method.
func mayCarryBlocked(stream []byte) bool {
	return bytes.Contains(stream, blockedIDs) || bytes.Contains(stream, unblockedIDs)
}
