package connfuzz

import (
	"bytes"

	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// frameMax is the frame-max the client settles on with the peer's default
// tune: the peer proposes 131072 and the client's default is the same.
const frameMax = 131072

// seed is one well-formed or deliberately malformed stream.
type seed struct {
	name   string
	stream []byte
}

// seeds returns the seed streams: every kind of frame a broker sends after
// the handshake, alone and mixed, and the classic malformations. The
// fuzzer mutates from here, so each seed is kept short and addresses what
// the client has: channel 1, consumer tag "fuzz", one published message.
func seeds() []seed {
	const ch = fuzzChannel
	cat := func(frames ...[]byte) []byte { return bytes.Join(frames, nil) }
	body := []byte("hello, fuzz")
	long := bytes.Repeat([]byte("0123456789abcdef"), 8) // 128 octets
	deliver := fakepeer.BasicDeliver(ch, consumerTag, 1, false, "", queueName, body, 0)
	ack := fakepeer.BasicAck(ch, 1, false)

	badEnd := bytes.Clone(ack)
	badEnd[len(badEnd)-1] = 0x00

	// The size field of a frame announces 4 GiB - 1 and nothing follows.
	hugeSize := []byte{fakepeer.FrameBody, 0, ch, 0xFF, 0xFF, 0xFF, 0xFF}

	return []seed{
		{"deliver, one body frame", deliver},
		{"deliver, several body frames", fakepeer.BasicDeliver(ch, consumerTag, 1, true, "ex", "rk", long, 40)},
		{"deliver, empty body", fakepeer.BasicDeliver(ch, consumerTag, 1, false, "", queueName, nil, 0)},
		{"deliver, two in a row", cat(deliver, fakepeer.BasicDeliver(ch, consumerTag, 2, false, "", queueName, long, 64))},
		{"deliver to an unknown consumer", fakepeer.BasicDeliver(ch, "nobody", 1, false, "", queueName, body, 0)},
		{"ack", ack},
		{"ack, multiple", fakepeer.BasicAck(ch, 3, true)},
		{"nack", fakepeer.BasicNack(ch, 1, false, true)},
		{"nack, multiple", fakepeer.BasicNack(ch, 2, true, false)},
		{"acks out of order", cat(fakepeer.BasicAck(ch, 3, false), fakepeer.BasicNack(ch, 2, false, false), ack)},
		{"return", fakepeer.BasicReturn(ch, 312, "NO_ROUTE", "", queueName, body, 0)},
		{"return, then ack", cat(fakepeer.BasicReturn(ch, 312, "NO_ROUTE", "", queueName, long, 48), ack)},
		{"basic.cancel", fakepeer.BasicCancel(ch, consumerTag, false)},
		{"channel.flow off and on", cat(fakepeer.ChannelFlow(ch, false), fakepeer.ChannelFlow(ch, true))},
		{"channel.close", fakepeer.ChannelClose(ch, 406, "PRECONDITION_FAILED", classBasic, basicPublish)},
		{"channel.close, then deliver", cat(fakepeer.ChannelClose(ch, 404, "NOT_FOUND", 0, 0), deliver)},
		{"connection.close", fakepeer.ConnectionClose(320, "CONNECTION_FORCED", 0, 0)},
		{"connection.blocked and unblocked", cat(fakepeer.ConnectionBlocked("low on memory"), fakepeer.ConnectionUnblocked())},
		{"heartbeats", cat(fakepeer.HeartbeatFrame(), fakepeer.HeartbeatFrame(), fakepeer.HeartbeatFrame())},
		{"everything", cat(
			fakepeer.HeartbeatFrame(), deliver, fakepeer.ConnectionBlocked("alarm"), ack,
			fakepeer.BasicReturn(ch, 312, "NO_ROUTE", "", queueName, body, 0),
			fakepeer.ChannelFlow(ch, false), fakepeer.HeartbeatFrame(),
			fakepeer.BasicDeliver(ch, consumerTag, 2, true, "", queueName, long, 40),
			fakepeer.ConnectionUnblocked(), fakepeer.BasicCancel(ch, consumerTag, false),
			fakepeer.ChannelClose(ch, 404, "NOT_FOUND", 0, 0),
			fakepeer.ConnectionClose(320, "CONNECTION_FORCED", 0, 0),
		)},
		{"truncated frame header", deliver[:5]},
		{"truncated frame payload", deliver[:len(deliver)-3]},
		{"bad frame-end octet", badEnd},
		{"oversize frame", fakepeer.BodyFrame(ch, make([]byte, frameMax))},
		{"frame size of 4 GiB", hugeSize},
		{"unknown channel", cat(fakepeer.BasicAck(7, 1, false), fakepeer.BasicDeliver(9, consumerTag, 1, false, "", queueName, body, 0))},
		{"unknown frame type", fakepeer.RawFrame(7, ch, []byte{1, 2, 3})},
		{"unknown class", fakepeer.MethodFrame(ch, 99, 10, nil)},
		{"unknown method", fakepeer.MethodFrame(ch, classBasic, 999, nil)},
		{"method arguments cut short", fakepeer.MethodFrame(ch, classBasic, 60, []byte{4, 'f'})},
		{"heartbeat on a channel", fakepeer.RawFrame(fakepeer.FrameHeartbeat, ch, nil)},
		{"content body without header", fakepeer.BodyFrame(ch, body)},
		{"content header without method", fakepeer.HeaderFrame(ch, classBasic, uint64(len(body)), 0, nil)},
		{"body longer than the header says", cat(
			fakepeer.MethodFrame(ch, classBasic, 60, new(fakepeer.Args).ShortStr(consumerTag).LongLong(1).Bits(false).ShortStr("").ShortStr(queueName).Bytes()),
			fakepeer.HeaderFrame(ch, classBasic, 3, 0, nil),
			fakepeer.BodyFrame(ch, body),
		)},
		{"header flags announce missing properties", cat(
			fakepeer.MethodFrame(ch, classBasic, 60, new(fakepeer.Args).ShortStr(consumerTag).LongLong(1).Bits(false).ShortStr("").ShortStr(queueName).Bytes()),
			fakepeer.HeaderFrame(ch, classBasic, uint64(len(body)), 0xFFFC, nil),
			fakepeer.BodyFrame(ch, body),
		)},
	}
}
