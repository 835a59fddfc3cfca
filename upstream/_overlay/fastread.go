// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"encoding/binary"
	"time"
)

// frameCursor reads AMQP fields from a frame; once one does not fit, ok is false.
type frameCursor struct {
	b  []byte
	i  int
	ok bool
}

// noField is what take returns once a field did not fit, never written to.
var noField [255]byte

// take returns the next n (≤ 255) bytes, aliasing the frame, or n zero bytes.
func (c *frameCursor) take(n int) []byte {
	if !c.ok || len(c.b)-c.i < n {
		c.ok = false
		return noField[:n:n]
	}
	v := c.b[c.i : c.i+n : c.i+n]
	c.i += n
	return v
}

// u8, u16 and u64 read a big-endian integer, 0 once a field did not fit.
func (c *frameCursor) u8() uint8        { return c.take(1)[0] }
func (c *frameCursor) u16() uint16      { return binary.BigEndian.Uint16(c.take(2)) }
func (c *frameCursor) u64() uint64      { return binary.BigEndian.Uint64(c.take(8)) }
func (c *frameCursor) shortstr() []byte { return c.take(int(c.u8())) }

// rawDeliver is basic.deliver with its strings still in the frame.
type rawDeliver struct {
	consumerTag, exchange, routingKey []byte
	deliveryTag                       uint64
	redelivered                       bool
}

// decodeDeliver decodes raw as basic.deliver, or returns false for upstream to parse.
func decodeDeliver(raw []byte, out *rawDeliver) bool {
	if len(raw) < frameHeaderSize+4 || raw[0] != frameMethod {
		return false
	}
	// As upstream: arguments unbounded by the frame's size, then frame-end.
	c := frameCursor{b: raw, i: 7, ok: true}
	if class, method := c.u16(), c.u16(); class != 60 || method != 60 {
		return false
	}
	out.consumerTag, out.deliveryTag, out.redelivered = c.shortstr(), c.u64(), c.u8()&1 != 0
	out.exchange, out.routingKey = c.shortstr(), c.shortstr()
	return c.ok && c.i < len(raw) && raw[c.i] == frameEnd
}

// The shortstr properties of a content header, in wire order.
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

// rawHeader is a content header, its strings in the frame; a bad table fails it.
type rawHeader struct {
	classId, weight        uint16
	size                   uint64
	flags                  uint16
	str                    [propStrings][]byte
	headers                Table
	deliveryMode, priority uint8
	timestamp              int64
}

// headerDecoder decodes content headers, reusing its table reader.
type headerDecoder struct{ table bytes.Reader }

// decode decodes raw as a content header, or returns false for upstream to report.
func (hd *headerDecoder) decode(raw []byte, out *rawHeader) bool {
	if len(raw) < frameHeaderSize || raw[0] != frameHeader {
		return false
	}
	// Upstream bounds the properties by the frame's size and skips the rest.
	size := binary.BigEndian.Uint32(raw[3:7])
	if uint64(size)+frameHeaderSize != uint64(len(raw)) {
		return false
	}
	c := frameCursor{b: raw[7 : 7+int(size)], ok: true}
	*out = rawHeader{classId: c.u16(), weight: c.u16(), size: c.u64(), flags: c.u16()}
	flags := out.flags
	str := func(flag uint16, i int) {
		if flags&flag != 0 {
			out.str[i] = c.shortstr()
		}
	}
	str(flagContentType, propContentType)
	str(flagContentEncoding, propContentEncoding)
	if flags&flagHeaders != 0 && c.ok {
		hd.table.Reset(c.b[c.i:])
		t, err := readTable(&hd.table)
		if err != nil {
			return false
		}
		out.headers = t
		c.i = len(c.b) - hd.table.Len()
	}
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
	if flags&flagTimestamp != 0 {
		out.timestamp = int64(c.u64())
	}
	str(flagType, propType)
	str(flagUserId, propUserId)
	str(flagAppId, propAppId)
	str(flagReserved1, propReserved1)
	return c.ok
}

// strCache reuses a field's last string; string(b) != s does not allocate.
type strCache struct{ s string }

func (c *strCache) get(b []byte) string {
	if string(b) != c.s {
		c.s = string(b)
	}
	return c.s
}

// The states of a content assembly: upstream's recvMethod, recvHeader, recvContent.
const (
	awaitMethod = iota
	awaitHeader
	awaitContent
)

// contentAsm is one channel's content assembly, owned by the reading goroutine.
type contentAsm struct {
	ch                 *Channel
	state              int
	fast               bool // started by a fast basic.deliver (deliver), else by msg
	deliver            deliverArgs
	msg                messageWithContent
	props              properties
	size               uint64
	body               []byte
	budget             *budget
	pinned             int64 // what the partial body is charged to budget
	pooled             pooledMemo
	tag, exchange, key strCache
	props1             [propStrings]strCache
}

// deliverArgs are a fast basic.deliver's arguments, strings from the caches.
type deliverArgs struct {
	consumerTag, exchange, routingKey string
	deliveryTag                       uint64
	redelivered                       bool
}

// The shortstr properties worth a cache: per-message ids never repeat.
var propCached = [propStrings]bool{
	propContentType: true, propContentEncoding: true, propReplyTo: true,
	propExpiration: true, propType: true, propUserId: true, propAppId: true,
}

// reset drops content in progress (or handed over), releasing its charge.
func (a *contentAsm) reset() {
	if a.pinned != 0 && a.budget != nil {
		a.budget.unpin(a.pinned)
	}
	a.state, a.msg, a.props, a.body, a.pinned = awaitMethod, nil, properties{}, nil, 0
}

// startDeliver begins the content of a fast basic.deliver.
func (a *contentAsm) startDeliver(rd *rawDeliver) {
	a.reset()
	a.state, a.fast = awaitHeader, true
	a.deliver = deliverArgs{a.tag.get(rd.consumerTag), a.exchange.get(rd.exchange),
		a.key.get(rd.routingKey), rd.deliveryTag, rd.redelivered}
}

// start begins the content of a method upstream's reader parsed.
func (a *contentAsm) start(msg messageWithContent) {
	a.reset()
	a.state, a.fast, a.msg = awaitHeader, false, msg
}

// headerProps turns a fast-decoded header's properties into upstream's.
func (a *contentAsm) headerProps(rh *rawHeader) properties {
	s := func(i int) string {
		if propCached[i] {
			return a.props1[i].get(rh.str[i])
		}
		return string(rh.str[i])
	}
	p := properties{
		ContentType:     s(propContentType),
		ContentEncoding: s(propContentEncoding),
		Headers:         rh.headers,
		DeliveryMode:    rh.deliveryMode,
		Priority:        rh.priority,
		CorrelationId:   s(propCorrelationId),
		ReplyTo:         s(propReplyTo),
		Expiration:      s(propExpiration),
		MessageId:       s(propMessageId),
		Type:            s(propType),
		UserId:          s(propUserId),
		AppId:           s(propAppId),
		reserved1:       s(propReserved1),
	}
	if rh.flags&flagTimestamp != 0 {
		p.Timestamp = time.Unix(rh.timestamp, 0)
	}
	return p
}

// header takes a content header; true when the content is complete.
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
	// The size is the peer's word: at most a frame ahead, as upstream since v1.17.0.
	capacity := uint64(maxFrame)
	if capacity == 0 {
		capacity = defaultFrameSize
	}
	if size < capacity {
		capacity = size
	}
	if a.fast && capacity == size && pooledConsumers.has(a.ch, a.deliver.consumerTag, &a.pooled) {
		a.body = pooledBody(size) // a ConsumeFunc consumer's (bodypool.go); nil if too big
	}
	if a.body == nil { // as reset left it
		a.body = make([]byte, 0, capacity)
	}
	a.state = awaitContent
	return false
}

// bodyFrame takes a body frame's payload; true when the content is complete.
func (a *contentAsm) bodyFrame(p []byte) bool {
	if a.state != awaitContent {
		a.reset() // drop and reset, as upstream
		return false
	}
	if need := len(a.body) + len(p); need > cap(a.body) {
		n := 2 * cap(a.body) // doubling, up to the size announced
		if uint64(n) > a.size {
			n = int(a.size)
		}
		if n < need {
			n = need
		}
		a.body = append(make([]byte, 0, n), a.body...)
	}
	a.body = append(a.body, p...)
	if uint64(len(a.body)) >= a.size {
		return true
	}
	if a.budget != nil { // charged while incomplete; a whole one as queued
		a.budget.pin(int64(len(p)))
		a.pinned += int64(len(p))
	}
	return false
}

// complete hands over the content (a Delivery, or upstream's message) and resets.
func (a *contentAsm) complete() (del *Delivery, msg messageWithContent) {
	if a.fast {
		del = newFastDelivery(a.ch, &a.deliver, &a.props, a.body)
	} else {
		msg = a.msg
		msg.setContent(a.props, a.body)
	}
	a.reset()
	return del, msg
}

// newFastDelivery is newDelivery for a fast basic.deliver, in a pooled Delivery (recycleDelivery).
func newFastDelivery(ch *Channel, m *deliverArgs, props *properties, body []byte) *Delivery {
	d := deliveries.Get().(*Delivery)
	*d = Delivery{Acknowledger: ch, Headers: props.Headers, ContentType: props.ContentType,
		ContentEncoding: props.ContentEncoding, DeliveryMode: props.DeliveryMode, Priority: props.Priority,
		CorrelationId: props.CorrelationId, ReplyTo: props.ReplyTo, Expiration: props.Expiration,
		MessageId: props.MessageId, Timestamp: props.Timestamp, Type: props.Type, UserId: props.UserId,
		AppId: props.AppId, ConsumerTag: m.consumerTag, Redelivered: m.redelivered, Exchange: m.exchange,
		RoutingKey: m.routingKey, Body: body,
		DeliveryTag: ch.tags.handOut(m.deliveryTag), // unique across recoveries (recoverytags.go)
	}
	return d
}

// contentReader is a generation's fast path; only the reading goroutine uses it.
type contentReader struct {
	hd     headerDecoder
	rd     rawDeliver
	rh     rawHeader
	asms   map[uint16]*contentAsm
	last   *contentAsm // asm's last: a content's frames come in a row
	budget *budget
}

// asm returns channel id's assembly, afresh if ch reuses the number.
func (cr *contentReader) asm(id uint16, ch *Channel) *contentAsm {
	if a := cr.last; a != nil && a.ch == ch { // ch holds id
		return a
	}
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
	cr.last = a
	return a
}

// release drops every content in progress, at the end of a generation.
func (cr *contentReader) release() {
	for _, a := range cr.asms {
		a.reset()
	}
}

// channelFrame is a decoded frame on channel ≠ 0: exactly one of f
// (upstream's parse), deliver (in cr.rd), header (in cr.rh), isBody is set.
type channelFrame struct {
	f               frame
	deliver, header bool
	body            []byte
	isBody          bool
}

// decode decodes raw (channel ≠ 0) fast if it can, else by upstream (FuzzFastDecode: they agree).
func (cr *contentReader) decode(split *frameSplitter, raw []byte) (channelFrame, error) {
	switch raw[0] {
	case frameBody: // cannot fail once the splitter checked the frame-end
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

// feed gives cf to a: content complete (take it: a.complete), or a method starting none.
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
