// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

// The fast path of frame decoding, for frames on a channel ≠ 0. Upstream parses every frame
// through an io.Reader, allocating each string and a frame struct; a consumer's traffic is almost
// all basic.deliver, content headers and body frames, so those three are decoded here straight
// from the frame's bytes, and a channel's content (method, header, bodies) is assembled where it
// is read. Every other frame, and any frame the fast decoders refuse, goes to upstream's parser
// (frameSplitter.parse), so upstream stays the judge of what is malformed: FuzzFastDecode checks
// that both accept the same frames and decode them to the same values.
//
// Who may touch what: a contentReader and its assemblies belong to the generation's READ TURN,
// not to a goroutine. Whoever holds the turn reads and routes one step (the drainer goroutine, a
// ConsumeFunc it lent the turn to, or in legacy mode the caller driving the read: DrainEvents, a
// ConsumeFunc or AutoDrain). The turn passes from one holder to the next over a channel, which
// orders every access to this state, so it needs no lock of its own.
//
// Lifetimes: a raw frame aliases the splitter's buffer, valid until the next fill, and so do
// rawDeliver's and rawHeader's byte fields. Whatever outlives the step is copied out before it
// ends: strings by startDeliver and headerProps, a headers table by readTable, body bytes into
// the assembly's own buffer (bodyFrame). A complete content holds nothing of the splitter's.

package amqp091

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"time"
)

// frameCursor reads AMQP fields from a frame. Once one field does not fit, ok turns false for good
// and every later read returns zeros, so a decoder reads its fields in a straight line and checks
// ok once at the end, as upstream checks its reader's first error.
type frameCursor struct {
	b  []byte
	i  int
	ok bool
}

// noField is what take returns once a field did not fit. It is shared by every cursor and never
// written: take's result has its length as capacity, so even an append copies it first.
var noField [255]byte

// take returns the next n (≤ 255) bytes, aliasing the frame, or n zero bytes. n is at most 255
// because every read is an integer of at most 8 octets or a shortstr, whose length is one octet,
// so noField always has the bytes. The result's capacity is its length, so that an append to it
// copies rather than overwrite the next field's bytes in the frame.
func (c *frameCursor) take(n int) []byte {
	if !c.ok || len(c.b)-c.i < n {
		c.ok = false
		return noField[:n:n]
	}
	v := c.b[c.i : c.i+n : c.i+n]
	c.i += n
	return v
}

// u8, u16 and u64 read a big-endian integer, 0 once a field did not fit. shortstr reads a length
// octet and that many bytes. Each advances the cursor: the order of the calls is the wire order.
func (c *frameCursor) u8() uint8        { return c.take(1)[0] }
func (c *frameCursor) u16() uint16      { return binary.BigEndian.Uint16(c.take(2)) }
func (c *frameCursor) u64() uint64      { return binary.BigEndian.Uint64(c.take(8)) }
func (c *frameCursor) shortstr() []byte { return c.take(int(c.u8())) }

// rawDeliver is basic.deliver with its strings still in the frame: they alias the splitter's
// buffer, so they are valid only until the next fill. startDeliver turns them into strings at
// once, through caches that spare the allocation when a string repeats.
type rawDeliver struct {
	consumerTag, exchange, routingKey []byte
	deliveryTag                       uint64
	redelivered                       bool
}

// decodeDeliver decodes raw as basic.deliver, or returns false for upstream to parse (another
// method, or a frame that does not decode: upstream then reports the error its own way).
func decodeDeliver(raw []byte, out *rawDeliver) bool {
	// The shortest method frame: the 7-octet header, the class and method ids (4 octets) and the
	// frame-end; frameHeaderSize counts the header and the frame-end.
	if len(raw) < frameHeaderSize+4 || raw[0] != frameMethod {
		return false
	}
	// As upstream: arguments unbounded by the frame's size, then frame-end. The payload starts
	// after the 7-octet frame header (type, channel, size).
	c := frameCursor{b: raw, i: 7, ok: true}
	class := c.u16()
	method := c.u16()
	if class != 60 || method != 60 { // basic (60), deliver (60)
		return false
	}
	// The arguments in wire order (spec 1.8.3.9, upstream's basicDeliver.read). Every read
	// advances the cursor, so these statements must stay in this order, one field each: a
	// reordering, or a multi-assignment someone reorders, reads each field from another's bytes.
	out.consumerTag = c.shortstr()
	out.deliveryTag = c.u64()
	out.redelivered = c.u8()&1 != 0 // bit 0 of the bits octet
	out.exchange = c.shortstr()
	out.routingKey = c.shortstr()
	// c.i < len(raw) guards the index: arguments that ran to the frame's last octet leave ok set
	// but no frame-end after them, and such a frame is refused, for upstream to judge.
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

// rawHeader is a content header, its strings in the frame (valid until the next fill, as
// rawDeliver's); a headers table is decoded by upstream's readTable, and a bad one fails the
// whole header, so that upstream's parse reports it. The table is the one property decoded to
// its final form here: its length is known only by reading it, and reading it builds it.
type rawHeader struct {
	classId, weight        uint16
	size                   uint64
	flags                  uint16
	str                    [propStrings][]byte
	headers                Table
	deliveryMode, priority uint8
	timestamp              int64
}

// headerDecoder decodes content headers, reusing its table reader: a bytes.Reader per header
// would be an allocation per message with headers. It is its contentReader's, so the read turn
// guards it too.
type headerDecoder struct{ table bytes.Reader }

// decode decodes raw as a content header, or returns false for upstream to report. The fields
// come in wire order: class, weight, body size, property flags, then each property the flags
// announce, in the flags' order (spec 4.2.6.1, upstream's parseHeaderFrame). Each read advances
// the cursor, so the order of the statements is the format: keep one field a statement.
func (hd *headerDecoder) decode(raw []byte, out *rawHeader) bool {
	if len(raw) < frameHeaderSize || raw[0] != frameHeader {
		return false
	}
	// Upstream bounds the properties by the frame's size and skips the rest; the splitter made
	// raw exactly one frame, so the check below only guards a caller passing something else.
	size := binary.BigEndian.Uint32(raw[3:7])
	if uint64(size)+frameHeaderSize != uint64(len(raw)) {
		return false
	}
	c := frameCursor{b: raw[7 : 7+int(size)], ok: true}
	// out is reused for every header (contentReader.rh): zeroed first, a property whose flag is
	// clear reads as absent, not as the previous header's value.
	*out = rawHeader{}
	out.classId = c.u16()
	out.weight = c.u16()
	out.size = c.u64()
	out.flags = c.u16()
	flags := out.flags
	str := func(flag uint16, i int) {
		if flags&flag != 0 {
			out.str[i] = c.shortstr()
		}
	}
	str(flagContentType, propContentType)
	str(flagContentEncoding, propContentEncoding)
	// Only while ok: after a field that did not fit, the cursor is not where the table starts,
	// and the header is refused at the end anyway.
	if flags&flagHeaders != 0 && c.ok {
		// The table's length is only known by reading it: readTable consumes it, and the
		// cursor resumes where the reader stopped.
		hd.table.Reset(c.b[c.i:])
		t, err := readTable(&hd.table)
		if err != nil {
			return false // upstream's parse reads the same table, and reports the error
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
		// Seconds since the epoch, as upstream reads it; headerProps makes it a time.Time.
		out.timestamp = int64(c.u64())
	}
	str(flagType, propType)
	str(flagUserId, propUserId)
	str(flagAppId, propAppId)
	str(flagReserved1, propReserved1)
	return c.ok
}

// strCache reuses a field's last string. The comparison string(b) != s does not allocate, so a
// field that repeats from message to message (a content type, an exchange) costs no allocation.
// It keeps one string, the last: a field that alternates between values allocates each time, no
// more than it would without the cache.
type strCache struct{ s string }

// get returns b as a string, the cached one when it is equal.
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

// contentAsm is one channel's content assembly: a content method (basic.deliver, basic.return,
// basic.get-ok), then its header, then body frames until the announced size, by the rules of
// upstream's state machine (Channel.recvMethod, recvHeader, recvContent). It belongs to the read
// turn's holder, as its contentReader does (file comment); nothing else reads it.
//
// A partial body is pinned in the budget (bodyFrame): it holds memory, yet only reading more
// can complete it, so it must never be the reason reading pauses (budget.pin).
type contentAsm struct {
	ch      *Channel // the channel this assembly serves; a new one with its id gets a new one
	state   int      // awaitMethod, awaitHeader or awaitContent
	fast    bool     // started by a fast basic.deliver (deliver), else by msg
	deliver deliverArgs
	msg     messageWithContent // the method upstream's parser decoded, when not fast
	props   properties
	size    uint64 // the body size the header announced
	body    []byte
	budget  *budget // nil in legacy, whose reads are never paused
	pinned  int64   // what the partial body is charged to budget
	pooled  pooledMemo
	// Caches for the strings that repeat from one delivery to the next (strCache).
	tag, exchange, key strCache
	props1             [propStrings]strCache
}

// deliverArgs are a fast basic.deliver's arguments, strings from the caches.
type deliverArgs struct {
	consumerTag, exchange, routingKey string
	deliveryTag                       uint64
	redelivered                       bool
}

// The shortstr properties worth a cache: per-message ids never repeat, and caching them would
// only replace one string with another.
var propCached = [propStrings]bool{
	propContentType: true, propContentEncoding: true, propReplyTo: true,
	propExpiration: true, propType: true, propUserId: true, propAppId: true,
}

// reset drops content in progress (or handed over), releasing its pinned charge. Every end of a
// content comes through here: complete, a method that interrupts it, a frame out of order, a
// new channel with the id (asm), and the generation's end (release); so no pin is left behind.
// fast, deliver and size are left as they are: start, startDeliver or header sets them first.
func (a *contentAsm) reset() {
	if a.pinned != 0 && a.budget != nil {
		a.budget.unpin(a.pinned)
	}
	a.state = awaitMethod
	a.msg = nil
	a.props = properties{}
	a.body = nil
	a.pinned = 0
}

// startDeliver begins the content of a fast basic.deliver. The frame's strings become strings
// here, before the next fill can overwrite the buffer they alias.
func (a *contentAsm) startDeliver(rd *rawDeliver) {
	a.reset()
	a.state = awaitHeader
	a.fast = true
	a.deliver = deliverArgs{
		consumerTag: a.tag.get(rd.consumerTag),
		exchange:    a.exchange.get(rd.exchange),
		routingKey:  a.key.get(rd.routingKey),
		deliveryTag: rd.deliveryTag,
		redelivered: rd.redelivered,
	}
}

// start begins the content of a method upstream's reader parsed.
func (a *contentAsm) start(msg messageWithContent) {
	a.reset()
	a.state = awaitHeader
	a.fast = false
	a.msg = msg
}

// headerProps turns a fast-decoded header's properties into upstream's, caching the strings
// that repeat (propCached). The caches are the assembly's, so a channel's: its messages tend
// to share a content type, a reply-to, an app id.
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

// header takes a content header; true when the content is complete (an empty body).
//
// The body's buffer: a consumer served by a ConsumeFunc gets a pooled one when the whole body
// fits what one frame may carry (bodypool.go says who owns it and when it returns); any other
// body gets a buffer of its own that the application keeps.
func (a *contentAsm) header(size uint64, props properties, maxFrame uint32) bool {
	if a.state != awaitHeader {
		a.reset() // drop and reset, as upstream
		return false
	}
	a.props = props
	a.size = size
	if size == 0 {
		a.body = make([]byte, 0) // empty and non-nil, as upstream
		return true
	}
	// The size is the peer's word: allocate at most a frame ahead, as upstream since v1.17.0,
	// so that a header claiming 4 GiB costs nothing until the bytes arrive.
	capacity := minOf(size, cmp.Or(uint64(maxFrame), defaultFrameSize))
	// a.fast first: only a fast basic.deliver has its consumer tag in a.deliver, which with the
	// channel is what pooledConsumers is keyed by.
	if a.fast && capacity == size &&
		pooledConsumers.has(a.ch, a.deliver.consumerTag, &a.pooled) {
		a.body = pooledBody(size) // nil if too big for the pool's classes
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
	// Grown by hand rather than by append, whose growth could overshoot the announced size: the
	// new buffer is capped at the size, unless the peer sends more than it announced.
	if need := len(a.body) + len(p); need > cap(a.body) {
		n := int(minOf(uint64(2*cap(a.body)), a.size)) // doubling, up to the size announced
		a.body = append(make([]byte, 0, max(n, need)), a.body...)
	}
	a.body = append(a.body, p...)
	// ≥, as upstream's recvContent: a body past the announced size completes the content, extra
	// bytes and all.
	if uint64(len(a.body)) >= a.size {
		return true
	}
	// Incomplete: pin what it holds (budget.pin). Complete, it is handed over and charged as a
	// queued job or delivery instead, and reset unpins this.
	if a.budget != nil {
		a.budget.pin(int64(len(p)))
		a.pinned += int64(len(p))
	}
	return false
}

// complete hands over the content (a Delivery, or upstream's message) and resets. The body is
// handed over, not copied: reset drops the assembly's reference to it (a.body = nil), so the
// next content never writes into a buffer the application holds.
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

// newFastDelivery is newDelivery for a fast basic.deliver, in a pooled *Delivery. Only the
// delivery path holds that pointer: a consumer loop copies the value out (into the Consume chan,
// or into ConsumeFunc's own Delivery) and then returns it to the pool (recycleDelivery), so no
// application code ever keeps it. The delivery tag is made unique across recoveries
// (recoverytags.go).
func newFastDelivery(ch *Channel, m *deliverArgs, props *properties, body []byte) *Delivery {
	d := deliveries.Get().(*Delivery)
	*d = Delivery{
		Acknowledger:    ch,
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
		ConsumerTag:     m.consumerTag,
		Redelivered:     m.redelivered,
		Exchange:        m.exchange,
		RoutingKey:      m.routingKey,
		Body:            body,
		DeliveryTag:     ch.tags.handOut(m.deliveryTag),
	}
	return d
}

// contentReader is a generation's fast path: its decoders and one assembly per channel. The
// READ TURN protects it, not a goroutine: whoever holds the generation's turn uses it (the
// drainer goroutine, a ConsumeFunc it lent the turn to, or in legacy mode the caller driving
// the read), and the turn's hand-over orders one holder's use before the next's.
//
// asms keeps one assembly per channel id across contents, so that its string caches and its
// pooled-body memo serve every message of the channel. rd and rh are reused for every frame: a
// fast channelFrame carries only a flag, and feed reads them before the next decode.
type contentReader struct {
	hd     headerDecoder
	rd     rawDeliver
	rh     rawHeader
	asms   map[uint16]*contentAsm
	last   *contentAsm // asm's last: a content's frames come in a row, sparing the map lookup
	budget *budget     // what partial bodies are pinned in; nil in legacy
}

// asm returns channel id's assembly, afresh if ch reuses the number: a channel closed and a new
// one opened with its id must not inherit a half-read content.
func (cr *contentReader) asm(id uint16, ch *Channel) *contentAsm {
	if a := cr.last; a != nil && a.ch == ch { // ch is id's channel now: a.ch has the same id
		return a
	}
	a := cr.asms[id]
	if a == nil {
		a = &contentAsm{ch: ch, budget: cr.budget}
		cr.asms[id] = a
	} else if a.ch != ch {
		a.reset() // unpins what the old channel's content held
		*a = contentAsm{ch: ch, budget: cr.budget}
	}
	cr.last = a
	return a
}

// release drops every content in progress at the end of a generation, unpinning what it held
// in the budget, which outlives the generation. Left pinned, the charge would stay in Stats'
// Budget.Used for the life of the connection, as nothing would ever complete that content.
func (cr *contentReader) release() {
	for _, a := range cr.asms {
		a.reset()
	}
}

// channelFrame is a decoded frame on channel ≠ 0: exactly one of f (upstream's parse),
// deliver (decoded into cr.rd), header (decoded into cr.rh) or isBody (the payload in body)
// is set. The fast cases point into cr and the frame, so a channelFrame is used at once: the
// next decode overwrites cr's values, and the next fill the frame's bytes.
type channelFrame struct {
	f               frame
	deliver, header bool
	body            []byte
	isBody          bool
}

// decode decodes raw (channel ≠ 0) fast if it can, else by upstream's parser. FuzzFastDecode
// checks that the two agree, so a frame refused here gets upstream's verdict and error.
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

// feed gives cf to a, upstream's recvMethod, recvHeader and recvContent in one. It returns
// complete when a's content is whole (take it with a.complete), or the method when cf is a
// method that starts no content (it goes to the channel's dispatch as it is).
// Upstream's three states fold into one switch on the frame: header and bodyFrame check the
// state, and reset on a frame out of order, as upstream drops it.
func (cr *contentReader) feed(
	a *contentAsm, cf *channelFrame, maxFrame uint32,
) (complete bool, method *methodFrame) {
	// The fast cases first: the frame's data is in cf and cr, not in a parsed frame.
	switch {
	case cf.isBody:
		return a.bodyFrame(cf.body), nil
	case cf.header:
		return a.header(cr.rh.size, a.headerProps(&cr.rh), maxFrame), nil
	case cf.deliver:
		a.startDeliver(&cr.rd)
		return false, nil
	}
	// Upstream parsed it: a method (content or not), or a header or body the fast path refused.
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
	return false, nil // upstream refuses a heartbeat on a channel ≠ 0: none gets here
}
