// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"bytes"
	"encoding/binary"
	"time"
)

// The receive fast path of the drainer and legacy modes.
//
// Upstream's reader parses every frame through io.Reader and binary.Read:
// each body frame is copied out of the socket buffer into a fresh slice,
// and the channel's state machine copies it again into the message body;
// every shortstr costs two allocations, and every frame a wrapper. The
// frame splitter (framesplit.go) already holds each complete frame in one
// slice, so the hot frames of a delivery are decoded here straight from it:
//
//   - basic.deliver: its arguments are sliced out of the frame, and their
//     strings come from a per-channel cache (the consumer tag, exchange and
//     routing key repeat from one delivery to the next);
//   - content headers: decoded on the slice, strings from the same cache
//     where values repeat, the headers table with upstream's readTable;
//   - body frames: copied once, into the body the header sized (a forged
//     size allocates nothing by itself: see contentAsm.header).
//
// Everything else, and any frame the fast path finds malformed, goes to
// upstream's reader (frameSplitter.parse), which then reports the error
// exactly as upstream does. FuzzFastDecode proves the two agree: on any
// bytes, a fast decode succeeds only where upstream's succeeds, with the
// same values, and declines only where upstream's fails.
//
// Content is assembled where the frames are read (the drainer goroutine,
// or legacy mode's turn holder), with upstream's state machine: a method
// interrupts content in progress, a header without a method or a body
// without a header is dropped and resets, a zero-size body completes at
// the header with an empty, non-nil body. Only the complete message goes
// on, so the body the application receives is the only copy.

// frameCursor reads AMQP fields from a frame slice; ok turns false at the
// first field that does not fit, and every later read is then a no-op.
type frameCursor struct {
	b  []byte
	i  int
	ok bool
}

// take returns the next n bytes, aliasing the frame, or nil once a field
// did not fit.
func (c *frameCursor) take(n int) []byte {
	if !c.ok || len(c.b)-c.i < n {
		c.ok = false
		return nil
	}
	v := c.b[c.i : c.i+n : c.i+n]
	c.i += n
	return v
}

func (c *frameCursor) u8() uint8 {
	if v := c.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (c *frameCursor) u16() uint16 {
	if v := c.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (c *frameCursor) u64() uint64 {
	if v := c.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// shortstr returns the bytes of a shortstr, aliasing the frame.
func (c *frameCursor) shortstr() []byte { return c.take(int(c.u8())) }

// rawDeliver is basic.deliver with its strings still in the frame.
type rawDeliver struct {
	consumerTag, exchange, routingKey []byte
	deliveryTag                       uint64
	redelivered                       bool
}

// decodeDeliver decodes raw, a complete frame from the splitter, as
// basic.deliver. It returns false when raw is not one, or is malformed:
// upstream's reader must then parse it.
func decodeDeliver(raw []byte, out *rawDeliver) bool {
	if len(raw) < frameHeaderSize+4 || raw[0] != frameMethod {
		return false
	}
	// Upstream parses a method from the stream, not bounded by the frame's
	// size, and then reads the frame-end octet wherever the arguments
	// ended; the stream here is the frame itself.
	c := frameCursor{b: raw, i: 7, ok: true}
	class := c.u16()
	if method := c.u16(); class != 60 || method != 60 {
		return false
	}
	out.consumerTag = c.shortstr()
	out.deliveryTag = c.u64()
	out.redelivered = c.u8()&1 != 0
	out.exchange = c.shortstr()
	out.routingKey = c.shortstr()
	return c.ok && c.i < len(raw) && raw[c.i] == frameEnd
}

// The shortstr properties of a content header, in rawHeader.str.
const (
	propContentType = iota
	propContentEncoding
	propCorrelationId
	propReplyTo
	propExpiration
	propMessageId
	propType
	propUserId
	propAppId
	propReserved1
	propStrings
)

// rawHeader is a content header frame with its strings still in the frame.
// headers is decoded, by upstream's readTable, since a malformed table must
// fail the frame.
type rawHeader struct {
	classId, weight uint16
	size            uint64
	flags           uint16
	str             [propStrings][]byte
	headers         Table
	deliveryMode    uint8
	priority        uint8
	timestamp       int64
}

// headerDecoder decodes content header frames; its reader is reset onto a
// headers table rather than allocated per frame.
type headerDecoder struct {
	table bytes.Reader
}

// decode decodes raw, a complete frame from the splitter, as a content
// header. It returns false when raw is malformed: upstream's reader then
// reports why.
func (hd *headerDecoder) decode(raw []byte, out *rawHeader) bool {
	if len(raw) < frameHeaderSize || raw[0] != frameHeader {
		return false
	}
	// Upstream bounds the properties by the frame's size and skips what
	// they leave of it; the splitter guarantees raw is exactly that long.
	size := binary.BigEndian.Uint32(raw[3:7])
	if uint64(size)+frameHeaderSize != uint64(len(raw)) {
		return false
	}
	c := frameCursor{b: raw[7 : 7+int(size)], ok: true}
	out.classId = c.u16()
	out.weight = c.u16()
	out.size = c.u64()
	flags := c.u16()
	out.flags = flags
	str := func(flag uint16, i int) {
		if flags&flag != 0 {
			out.str[i] = c.shortstr()
		} else {
			out.str[i] = nil
		}
	}
	str(flagContentType, propContentType)
	str(flagContentEncoding, propContentEncoding)
	out.headers = nil
	if flags&flagHeaders != 0 && c.ok {
		hd.table.Reset(c.b[c.i:])
		t, err := readTable(&hd.table)
		if err != nil {
			return false
		}
		out.headers = t
		c.i = len(c.b) - hd.table.Len()
	}
	out.deliveryMode, out.priority = 0, 0
	if flags&flagDeliveryMode != 0 {
		out.deliveryMode = c.u8()
	}
	if flags&flagPriority != 0 {
		out.priority = c.u8()
	}
	str(flagCorrelationId, propCorrelationId)
	str(flagReplyTo, propReplyTo)
	str(flagExpiration, propExpiration)
	str(flagMessageId, propMessageId)
	out.timestamp = 0
	if flags&flagTimestamp != 0 {
		out.timestamp = int64(c.u64())
	}
	str(flagType, propType)
	str(flagUserId, propUserId)
	str(flagAppId, propAppId)
	str(flagReserved1, propReserved1)
	return c.ok
}

// strCache keeps the last string made from a field, so a value that
// repeats from one message to the next (exchange, routing key, content
// type) is allocated once per channel rather than once per message.
// Comparing string(b) with a string does not allocate.
type strCache struct{ s string }

func (c *strCache) get(b []byte) string {
	if string(b) != c.s {
		c.s = string(b)
	}
	return c.s
}

// assemblyState is where a channel's content assembly stands, as in
// upstream's channel state machine (recvMethod, recvHeader, recvContent).
type assemblyState int

const (
	awaitMethod assemblyState = iota
	awaitHeader
	awaitContent
)

// contentAsm is one channel's content assembly, owned by the goroutine
// that reads frames: the drainer, or legacy mode's turn holder.
type contentAsm struct {
	ch    *Channel
	state assemblyState

	// The method that started the content: a basic.deliver decoded by the
	// fast path (deliver, with fast set), or any other content method as
	// upstream's reader parsed it (msg).
	fast    bool
	deliver deliverArgs
	msg     messageWithContent

	props properties
	size  uint64
	body  []byte

	// pinned is what the body received so far is charged to the budget.
	budget *budget
	pinned int64

	// Values that repeat between messages on a channel.
	tag, exchange, key strCache
	props1             [propStrings]strCache
}

// deliverArgs are the arguments of a basic.deliver from the fast path,
// with its strings taken from the channel's caches.
type deliverArgs struct {
	consumerTag, exchange, routingKey string
	deliveryTag                       uint64
	redelivered                       bool
}

// Which shortstr properties repeat enough to be worth a cache: the
// identifiers of one message (correlation, message id) never do.
var propCached = [propStrings]bool{
	propContentType: true, propContentEncoding: true, propReplyTo: true,
	propExpiration: true, propType: true, propUserId: true, propAppId: true,
}

// reset drops content in progress, releasing its charge.
func (a *contentAsm) reset() {
	a.unpin()
	a.state = awaitMethod
	a.msg = nil
	a.props = properties{}
	a.body = nil
}

func (a *contentAsm) unpin() {
	if a.pinned != 0 && a.budget != nil {
		a.budget.unpin(a.pinned)
	}
	a.pinned = 0
}

// startDeliver begins the content of a basic.deliver from the fast path.
func (a *contentAsm) startDeliver(rd *rawDeliver) {
	a.reset()
	a.state = awaitHeader
	a.fast = true
	a.deliver.consumerTag = a.tag.get(rd.consumerTag)
	a.deliver.exchange = a.exchange.get(rd.exchange)
	a.deliver.routingKey = a.key.get(rd.routingKey)
	a.deliver.deliveryTag = rd.deliveryTag
	a.deliver.redelivered = rd.redelivered
}

// start begins the content of a method upstream's reader parsed.
func (a *contentAsm) start(msg messageWithContent) {
	a.reset()
	a.state = awaitHeader
	a.fast = false
	a.msg = msg
}

// headerProps turns a fast-decoded header's properties into upstream's.
func (a *contentAsm) headerProps(rh *rawHeader) properties {
	var s [propStrings]string
	for i, b := range rh.str {
		if propCached[i] {
			s[i] = a.props1[i].get(b)
		} else {
			s[i] = string(b)
		}
	}
	p := properties{
		ContentType:     s[propContentType],
		ContentEncoding: s[propContentEncoding],
		Headers:         rh.headers,
		DeliveryMode:    rh.deliveryMode,
		Priority:        rh.priority,
		CorrelationId:   s[propCorrelationId],
		ReplyTo:         s[propReplyTo],
		Expiration:      s[propExpiration],
		MessageId:       s[propMessageId],
		Type:            s[propType],
		UserId:          s[propUserId],
		AppId:           s[propAppId],
		reserved1:       s[propReserved1],
	}
	if rh.flags&flagTimestamp != 0 {
		p.Timestamp = time.Unix(rh.timestamp, 0)
	}
	return p
}

// header takes a content header. It reports whether the content is
// complete (a zero-size body).
func (a *contentAsm) header(size uint64, props properties, maxFrame uint32) bool {
	if a.state != awaitHeader {
		a.reset() // drop and reset, as upstream
		return false
	}
	a.props, a.size = props, size
	if size == 0 {
		a.body = make([]byte, 0) // empty and non-nil, as upstream
		return true
	}
	// Sized from the header, but never trusted for more than one frame
	// ahead of the bytes received; with no frame_max negotiated, for no
	// more than upstream's default frame size, as upstream's recvContent
	// bounds it since v1.17.0 (the size is the peer's word).
	capacity := size
	limit := uint64(maxFrame)
	if limit == 0 {
		limit = defaultFrameSize
	}
	if capacity > limit {
		capacity = limit
	}
	a.body = nil
	if a.fast && capacity == size && pooledConsumers.has(a.ch, a.deliver.consumerTag) {
		// A ConsumeFunc consumer's body, recycled when its handler
		// returns (bodypool.go).
		a.body = pooledBody(size)
	}
	if a.body == nil {
		a.body = make([]byte, 0, capacity)
	}
	a.state = awaitContent
	return false
}

// bodyFrame takes a body frame's payload. It reports whether the content
// is complete.
func (a *contentAsm) bodyFrame(p []byte) bool {
	if a.state != awaitContent {
		a.reset() // drop and reset, as upstream
		return false
	}
	need := len(a.body) + len(p)
	if need > cap(a.body) {
		// Beyond what the header let us trust: grow by doubling, still
		// bounded by what was received, up to the size announced.
		n := 2 * cap(a.body)
		if uint64(n) > a.size {
			n = int(a.size)
		}
		if n < need {
			n = need
		}
		grown := make([]byte, len(a.body), n)
		copy(grown, a.body)
		a.body = grown
	}
	a.body = append(a.body, p...)
	if uint64(len(a.body)) >= a.size {
		return true
	}
	// Charged only while the message stays incomplete: most fit in one
	// frame, and their body is charged once, as they are queued.
	if a.budget != nil {
		a.budget.pin(int64(len(p)))
		a.pinned += int64(len(p))
	}
	return false
}

// complete hands over the complete content, as either a Delivery (fast
// basic.deliver) or upstream's message, and resets. The body's charge is
// released: the caller charges the message as it queues it.
func (a *contentAsm) complete() (*Delivery, messageWithContent) {
	a.unpin()
	body := a.body
	var del *Delivery
	var msg messageWithContent
	if a.fast {
		del = newFastDelivery(a.ch, &a.deliver, &a.props, body)
	} else {
		msg = a.msg
		msg.setContent(a.props, body)
	}
	a.state, a.msg, a.props, a.body = awaitMethod, nil, properties{}, nil
	return del, msg
}

// newFastDelivery is newDelivery for a basic.deliver of the fast path.
func newFastDelivery(ch *Channel, m *deliverArgs, props *properties, body []byte) *Delivery {
	return &Delivery{
		Acknowledger: ch,

		Headers:         props.Headers,
		ContentType:     props.ContentType,
		ContentEncoding: props.ContentEncoding,
		DeliveryMode:    props.DeliveryMode,
		Priority:        props.Priority,
		CorrelationId:   props.CorrelationId,
		ReplyTo:         props.ReplyTo,
		Expiration:      props.Expiration,
		MessageId:       props.MessageId,
		Timestamp:       props.Timestamp,
		Type:            props.Type,
		UserId:          props.UserId,
		AppId:           props.AppId,

		ConsumerTag: m.consumerTag,
		DeliveryTag: ch.tags.handOut(m.deliveryTag), // unique across recoveries (recoverytags.go)
		Redelivered: m.redelivered,
		Exchange:    m.exchange,
		RoutingKey:  m.routingKey,

		Body: body,
	}
}

// contentReader is the fast path's state for one connection generation:
// the decoders, and each channel's assembly. Only the goroutine reading
// frames touches it.
type contentReader struct {
	hd     headerDecoder
	rd     rawDeliver
	rh     rawHeader
	asms   map[uint16]*contentAsm
	budget *budget
}

// asm returns the assembly of channel id, which is ch now. A channel
// number reused by another Channel starts afresh.
func (cr *contentReader) asm(id uint16, ch *Channel) *contentAsm {
	a := cr.asms[id]
	if a == nil {
		if cr.asms == nil {
			cr.asms = map[uint16]*contentAsm{}
		}
		a = &contentAsm{ch: ch, budget: cr.budget}
		cr.asms[id] = a
	} else if a.ch != ch {
		a.reset()
		*a = contentAsm{ch: ch, budget: cr.budget}
	}
	return a
}

// release drops every content in progress, at the end of a generation.
func (cr *contentReader) release() {
	for _, a := range cr.asms {
		a.reset()
	}
}

// channelFrame is a frame on a channel other than 0, decoded by the fast
// path where it could be: exactly one of f (upstream's parse), deliver,
// header and body is set.
type channelFrame struct {
	f       frame
	deliver bool // cr.rd holds it
	header  bool // cr.rh holds it
	body    []byte
	isBody  bool
}

// decode decodes raw, a complete frame on channel ≠ 0, with the fast path
// where it can, and upstream's reader (split.parse) otherwise. An error is
// upstream's.
func (cr *contentReader) decode(split *frameSplitter, raw []byte) (channelFrame, error) {
	switch raw[0] {
	case frameBody:
		// Upstream's parse of a body frame cannot fail once the splitter
		// has checked its frame-end.
		return channelFrame{body: raw[7 : len(raw)-1], isBody: true}, nil
	case frameHeader:
		if cr.hd.decode(raw, &cr.rh) {
			return channelFrame{header: true}, nil
		}
	case frameMethod:
		if decodeDeliver(raw, &cr.rd) {
			return channelFrame{deliver: true}, nil
		}
	}
	f, err := split.parse(raw)
	return channelFrame{f: f}, err
}

// upstreamFrame returns cf as upstream's reader would have parsed it, for
// the rare paths (a frame on a channel that is not open) that need it.
func (cf *channelFrame) upstreamFrame(split *frameSplitter, raw []byte) frame {
	if cf.f == nil {
		cf.f, _ = split.parse(raw) // the fast path succeeded: so does this
	}
	return cf.f
}

// feed gives a decoded frame to a's assembly. It reports whether a content
// is complete (take it with a.complete), and returns, for a method that
// does not start content, the method for the caller to dispatch.
func (cr *contentReader) feed(a *contentAsm, cf *channelFrame, maxFrame uint32) (complete bool, method *methodFrame) {
	switch {
	case cf.isBody:
		return a.bodyFrame(cf.body), nil
	case cf.header:
		return a.header(cr.rh.size, a.headerProps(&cr.rh), maxFrame), nil
	case cf.deliver:
		a.startDeliver(&cr.rd)
		return false, nil
	}
	switch fr := cf.f.(type) {
	case *methodFrame:
		if msg, ok := fr.Method.(messageWithContent); ok {
			a.start(msg)
			return false, nil
		}
		a.reset() // a method interrupts content in progress (spec 4.2.6)
		return false, fr
	case *headerFrame:
		return a.header(fr.Size, fr.Properties, maxFrame), nil
	case *bodyFrame:
		return a.bodyFrame(fr.Body), nil
	}
	return false, nil // a heartbeat cannot parse on a channel ≠ 0
}
