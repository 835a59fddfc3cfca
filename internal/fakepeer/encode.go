package fakepeer

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"time"
)

// Frame types and the frame-end octet of AMQP 0-9-1 (section 4.2.3). They
// are exported so that tests can build frames the client must reject, such
// as an unknown type or a wrong frame-end, with RawFrame.
const (
	FrameMethod    = 1    // method frame
	FrameHeader    = 2    // content header frame
	FrameBody      = 3    // content body frame
	FrameHeartbeat = 8    // heartbeat frame
	FrameEnd       = 0xCE // last octet of every well-formed frame
)

// frameOverhead is what a frame adds around its payload: type(1),
// channel(2), size(4) and frame-end(1). A negotiated frame-max counts it.
const frameOverhead = 8

// Class and method IDs of AMQP 0-9-1, limited to those the peer builds or
// reads itself. Tests pass plain numbers to ExpectMethod and MethodFrame.
const (
	classConnection = 10
	classChannel    = 20
	classQueue      = 50
	classBasic      = 60
	classConfirm    = 85

	connectionStart     = 10
	connectionStartOk   = 11
	connectionTune      = 30
	connectionTuneOk    = 31
	connectionOpen      = 40
	connectionOpenOk    = 41
	connectionClose     = 50
	connectionCloseOk   = 51
	connectionBlocked   = 60
	connectionUnblocked = 61

	channelOpen    = 10
	channelOpenOk  = 11
	channelFlow    = 20
	channelClose   = 40
	channelCloseOk = 41

	queueDeclareOk = 11

	basicQosOk     = 11
	basicConsume   = 20
	basicConsumeOk = 21
	basicCancel    = 30
	basicCancelOk  = 31
	basicReturn    = 50
	basicDeliver   = 60
	basicAck       = 80
	basicNack      = 120

	confirmSelectOk = 11
)

// RawFrame returns one frame with the given type, channel and payload, and
// a correct size field and frame-end. It checks nothing, so that tests can
// build frames a client must refuse: an unknown type, a payload larger
// than the negotiated frame-max, a heartbeat on a non-zero channel. To
// build a wrong frame-end, change the last octet of the result.
func RawFrame(typ uint8, channel uint16, payload []byte) []byte {
	b := make([]byte, 0, len(payload)+frameOverhead)
	b = append(b, typ)
	b = binary.BigEndian.AppendUint16(b, channel)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	return append(b, FrameEnd)
}

// MethodFrame returns a method frame: class-id(2) method-id(2) args.
// Build args with Args.
func MethodFrame(channel, classID, methodID uint16, args []byte) []byte {
	p := make([]byte, 0, 4+len(args))
	p = binary.BigEndian.AppendUint16(p, classID)
	p = binary.BigEndian.AppendUint16(p, methodID)
	return RawFrame(FrameMethod, channel, append(p, args...))
}

// HeaderFrame returns a content header frame: class-id(2) weight(2)=0
// body-size(8) property-flags(2) properties. props must hold exactly the
// properties that propFlags announces, encoded with Args; nothing checks it,
// so that tests can send headers that disagree with their flags.
func HeaderFrame(channel, classID uint16, bodySize uint64, propFlags uint16, props []byte) []byte {
	p := make([]byte, 0, 14+len(props))
	p = binary.BigEndian.AppendUint16(p, classID)
	p = binary.BigEndian.AppendUint16(p, 0)
	p = binary.BigEndian.AppendUint64(p, bodySize)
	p = binary.BigEndian.AppendUint16(p, propFlags)
	return RawFrame(FrameHeader, channel, append(p, props...))
}

// BodyFrame returns one content body frame carrying body as it is, however
// long; use Content to split a body at a frame-max.
func BodyFrame(channel uint16, body []byte) []byte {
	return RawFrame(FrameBody, channel, body)
}

// HeartbeatFrame returns a heartbeat frame (type 8, channel 0, empty).
func HeartbeatFrame() []byte {
	return RawFrame(FrameHeartbeat, 0, nil)
}

// Content returns the header frame (class basic, no properties) and the
// body frames that follow a basic.deliver, basic.return or basic.get-ok.
// The body is split so that no frame exceeds frameMax octets, overhead
// included, as a broker must; frameMax 0 means no limit, one body frame. An
// empty body gets no body frame at all, as the specification requires.
func Content(channel uint16, body []byte, frameMax uint32) []byte {
	b := HeaderFrame(channel, classBasic, uint64(len(body)), 0, nil)
	chunk := len(body)
	if frameMax > 0 {
		if frameMax <= frameOverhead {
			panic(fmt.Sprintf("fakepeer: Content: frameMax %d leaves no room for a body", frameMax))
		}
		chunk = int(frameMax - frameOverhead)
	}
	for len(body) > 0 {
		n := min(chunk, len(body))
		b = append(b, BodyFrame(channel, body[:n])...)
		body = body[n:]
	}
	return b
}

// Table is an AMQP field table. Encoding sorts the keys so that a Table
// always yields the same bytes. Values may be bool, int8, uint8, int16,
// uint16, int32, uint32, int64, float32, float64, string (long string),
// []byte, time.Time (seconds), Table, []any or nil; Args.Table panics on any
// other type, and ArgReader.Table decodes to these same types.
type Table map[string]any

// Args builds the arguments of a method or the properties of a content
// header, field by field, in order. The zero value is empty and ready to
// use; every method appends and returns the receiver, so calls chain:
//
//	args := new(fakepeer.Args).ShortStr("ctag").LongLong(1).Bits(false).Bytes()
//
// Values that cannot be encoded (a short string over 255 octets, an
// unsupported table value) are bugs in the test and panic.
type Args struct {
	b []byte
}

// Bytes returns the encoded arguments.
func (a *Args) Bytes() []byte { return a.b }

// Raw appends b unchanged, for arguments this type has no encoder for and
// for deliberately malformed ones.
func (a *Args) Raw(b []byte) *Args {
	a.b = append(a.b, b...)
	return a
}

// Octet appends one octet.
func (a *Args) Octet(v uint8) *Args {
	a.b = append(a.b, v)
	return a
}

// Short appends a 16-bit big-endian integer.
func (a *Args) Short(v uint16) *Args {
	a.b = binary.BigEndian.AppendUint16(a.b, v)
	return a
}

// Long appends a 32-bit big-endian integer.
func (a *Args) Long(v uint32) *Args {
	a.b = binary.BigEndian.AppendUint32(a.b, v)
	return a
}

// LongLong appends a 64-bit big-endian integer.
func (a *Args) LongLong(v uint64) *Args {
	a.b = binary.BigEndian.AppendUint64(a.b, v)
	return a
}

// ShortStr appends a short string: length octet, then the octets.
func (a *Args) ShortStr(s string) *Args {
	if len(s) > math.MaxUint8 {
		panic(fmt.Sprintf("fakepeer: short string of %d octets", len(s)))
	}
	a.b = append(a.b, uint8(len(s)))
	a.b = append(a.b, s...)
	return a
}

// LongStr appends a long string: 32-bit length, then the octets.
func (a *Args) LongStr(s string) *Args {
	a.Long(uint32(len(s)))
	a.b = append(a.b, s...)
	return a
}

// Bits appends consecutive bit arguments packed into octets, the first in
// the lowest bit, as AMQP packs adjacent bit fields. Pass all adjacent bits
// of a method in one call: each call starts a new octet.
func (a *Args) Bits(v ...bool) *Args {
	for i := 0; i < len(v); i += 8 {
		var o uint8
		for j := 0; j < 8 && i+j < len(v); j++ {
			if v[i+j] {
				o |= 1 << j
			}
		}
		a.b = append(a.b, o)
	}
	return a
}

// Table appends a field table: 32-bit size, then the fields, keys sorted.
func (a *Args) Table(t Table) *Args {
	a.b = appendTable(a.b, t)
	return a
}

func appendTable(b []byte, t Table) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0) // size, patched below
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if len(k) > math.MaxUint8 {
			panic(fmt.Sprintf("fakepeer: table key of %d octets", len(k)))
		}
		b = append(b, uint8(len(k)))
		b = append(b, k...)
		b = appendField(b, t[k])
	}
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b
}

func appendField(b []byte, v any) []byte {
	switch v := v.(type) {
	case bool:
		o := uint8(0)
		if v {
			o = 1
		}
		return append(b, 't', o)
	case int8:
		return append(b, 'b', uint8(v))
	case uint8:
		return append(b, 'B', v)
	case int16:
		return binary.BigEndian.AppendUint16(append(b, 's'), uint16(v))
	case uint16:
		return binary.BigEndian.AppendUint16(append(b, 'u'), v)
	case int32:
		return binary.BigEndian.AppendUint32(append(b, 'I'), uint32(v))
	case uint32:
		return binary.BigEndian.AppendUint32(append(b, 'i'), v)
	case int64:
		return binary.BigEndian.AppendUint64(append(b, 'l'), uint64(v))
	case float32:
		return binary.BigEndian.AppendUint32(append(b, 'f'), math.Float32bits(v))
	case float64:
		return binary.BigEndian.AppendUint64(append(b, 'd'), math.Float64bits(v))
	case string:
		b = binary.BigEndian.AppendUint32(append(b, 'S'), uint32(len(v)))
		return append(b, v...)
	case []byte:
		b = binary.BigEndian.AppendUint32(append(b, 'x'), uint32(len(v)))
		return append(b, v...)
	case time.Time:
		return binary.BigEndian.AppendUint64(append(b, 'T'), uint64(v.Unix()))
	case Table:
		return appendTable(append(b, 'F'), v)
	case []any:
		b = append(b, 'A')
		at := len(b)
		b = append(b, 0, 0, 0, 0) // size, patched below
		for _, e := range v {
			b = appendField(b, e)
		}
		binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
		return b
	case nil:
		return append(b, 'V')
	default:
		panic(fmt.Sprintf("fakepeer: cannot encode table value of type %T", v))
	}
}

// ConnectionClose returns connection.close: the broker closing the whole
// connection with reply code and text, naming the method that caused it
// (0, 0 for none).
func ConnectionClose(code uint16, text string, classID, methodID uint16) []byte {
	args := new(Args).Short(code).ShortStr(text).Short(classID).Short(methodID)
	return MethodFrame(0, classConnection, connectionClose, args.Bytes())
}

// ConnectionCloseOk returns connection.close-ok, the answer to the
// client's connection.close.
func ConnectionCloseOk() []byte {
	return MethodFrame(0, classConnection, connectionCloseOk, nil)
}

// ConnectionBlocked returns connection.blocked with the given reason.
func ConnectionBlocked(reason string) []byte {
	return MethodFrame(0, classConnection, connectionBlocked, new(Args).ShortStr(reason).Bytes())
}

// ConnectionUnblocked returns connection.unblocked.
func ConnectionUnblocked() []byte {
	return MethodFrame(0, classConnection, connectionUnblocked, nil)
}

// ChannelOpenOk returns channel.open-ok, the answer to channel.open.
func ChannelOpenOk(channel uint16) []byte {
	return MethodFrame(channel, classChannel, channelOpenOk, new(Args).LongStr("").Bytes())
}

// ChannelFlow returns channel.flow, asking the client to stop (active
// false) or resume (active true) publishing on the channel.
func ChannelFlow(channel uint16, active bool) []byte {
	return MethodFrame(channel, classChannel, channelFlow, new(Args).Bits(active).Bytes())
}

// ChannelClose returns channel.close: the broker closing one channel with
// reply code and text, naming the method that caused it (0, 0 for none).
func ChannelClose(channel, code uint16, text string, classID, methodID uint16) []byte {
	args := new(Args).Short(code).ShortStr(text).Short(classID).Short(methodID)
	return MethodFrame(channel, classChannel, channelClose, args.Bytes())
}

// ChannelCloseOk returns channel.close-ok, the answer to channel.close.
func ChannelCloseOk(channel uint16) []byte {
	return MethodFrame(channel, classChannel, channelCloseOk, nil)
}

// QueueDeclareOk returns queue.declare-ok, the answer to queue.declare.
func QueueDeclareOk(channel uint16, queue string, messageCount, consumerCount uint32) []byte {
	args := new(Args).ShortStr(queue).Long(messageCount).Long(consumerCount)
	return MethodFrame(channel, classQueue, queueDeclareOk, args.Bytes())
}

// BasicQosOk returns basic.qos-ok, the answer to basic.qos.
func BasicQosOk(channel uint16) []byte {
	return MethodFrame(channel, classBasic, basicQosOk, nil)
}

// BasicConsumeOk returns basic.consume-ok, the answer to basic.consume.
// The client routes deliveries by consumerTag, so it must be the tag the
// client sent (Session.AnswerConsume does that).
func BasicConsumeOk(channel uint16, consumerTag string) []byte {
	return MethodFrame(channel, classBasic, basicConsumeOk, new(Args).ShortStr(consumerTag).Bytes())
}

// BasicCancel returns basic.cancel as the broker sends it when a consumer's
// queue goes away (consumer_cancel_notify).
func BasicCancel(channel uint16, consumerTag string, noWait bool) []byte {
	args := new(Args).ShortStr(consumerTag).Bits(noWait)
	return MethodFrame(channel, classBasic, basicCancel, args.Bytes())
}

// BasicCancelOk returns basic.cancel-ok, the answer to the client's
// basic.cancel.
func BasicCancelOk(channel uint16, consumerTag string) []byte {
	return MethodFrame(channel, classBasic, basicCancelOk, new(Args).ShortStr(consumerTag).Bytes())
}

// BasicReturn returns basic.return followed by the returned message's
// content frames, split at frameMax as Content does.
func BasicReturn(channel, code uint16, text, exchange, routingKey string, body []byte, frameMax uint32) []byte {
	args := new(Args).Short(code).ShortStr(text).ShortStr(exchange).ShortStr(routingKey)
	b := MethodFrame(channel, classBasic, basicReturn, args.Bytes())
	return append(b, Content(channel, body, frameMax)...)
}

// BasicDeliver returns basic.deliver followed by the message's content
// frames, split at frameMax as Content does; pass Session.FrameMax to split
// as a broker would.
func BasicDeliver(channel uint16, consumerTag string, deliveryTag uint64, redelivered bool, exchange, routingKey string, body []byte, frameMax uint32) []byte {
	args := new(Args).ShortStr(consumerTag).LongLong(deliveryTag).Bits(redelivered).
		ShortStr(exchange).ShortStr(routingKey)
	b := MethodFrame(channel, classBasic, basicDeliver, args.Bytes())
	return append(b, Content(channel, body, frameMax)...)
}

// BasicAck returns basic.ack, a publisher confirm for deliveryTag (and
// every earlier tag when multiple is set).
func BasicAck(channel uint16, deliveryTag uint64, multiple bool) []byte {
	args := new(Args).LongLong(deliveryTag).Bits(multiple)
	return MethodFrame(channel, classBasic, basicAck, args.Bytes())
}

// BasicNack returns basic.nack, a negative publisher confirm.
func BasicNack(channel uint16, deliveryTag uint64, multiple, requeue bool) []byte {
	args := new(Args).LongLong(deliveryTag).Bits(multiple, requeue)
	return MethodFrame(channel, classBasic, basicNack, args.Bytes())
}

// ConfirmSelectOk returns confirm.select-ok, the answer to confirm.select.
func ConfirmSelectOk(channel uint16) []byte {
	return MethodFrame(channel, classConfirm, confirmSelectOk, nil)
}
