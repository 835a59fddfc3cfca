// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"sync"
	"time"
)

// The publish fast path of the drainer and legacy modes. The method and header frames are
// encoded into one pooled buffer before any lock, the body frames' headers under ch.m, and
// buffer and body go out in one vectored write (writev on TCP), where upstream makes 29
// allocations and copies the body. The bytes, the errors and their effect are upstream's
// (publish_test.go), except that a publish that cannot be encoded writes nothing, where
// upstream writes the frames before the bad one.
//
// Locks, in the order they are taken: ch.m, for the whole of a publish from its confirmation
// tag to the end of its write, so that a channel's tags are handed out in the order its
// publishes reach the socket (the broker confirms by that order); then, with CoalescePublishes,
// the group commit's writer role (groupcommit.go); then c.sendM, under which the frames go out,
// so that no other frame lands between a publish's method, header and body frames.

const (
	// publishCopyMax is the largest body copied into the frame buffer: the publish is then one
	// buffer, one write and, over TLS, one record. Larger bodies are written from the caller's
	// slice, to save the copy. The figure is a judgement, not a measured optimum.
	publishCopyMax = 2048
	// publishPoolMax and publishPoolMaxVecs bound what goes back to the pool: a buffer grown
	// for one big publish is dropped rather than kept alive by the pool.
	publishPoolMax     = 64 << 10
	publishPoolMaxVecs = 256
)

// publishBuf is one publish's encoding, reused through publishBufs. The publishing call owns
// it from Get to putPublishBuf, after its write returned: even in the group commit the write
// is done by then (groupcommit.go), so nothing still points into it when it is reused.
type publishBuf struct {
	b    []byte      // the encoded frames; bodies up to publishCopyMax too
	head int         // len(b) after the method and header frames
	vecs [][]byte    // what goes to the socket, in order: parts of b and of the body
	wv   net.Buffers // vecs as a vectored write consumes it (writeVecs)
}

// publishBufs pools the encodings. A new one starts with 512 bytes and 8 buffers, a first
// guess: it grows as a publish needs, and goes back to the pool at that size.
var publishBufs = sync.Pool{New: func() any {
	return &publishBuf{b: make([]byte, 0, 512), vecs: make([][]byte, 0, 8)}
}}

// putPublishBuf pools pb, first dropping its references to the body, so that the pool never
// keeps an application's body alive.
func putPublishBuf(pb *publishBuf) {
	for i := range pb.vecs {
		pb.vecs[i] = nil
	}
	if cap(pb.b) > publishPoolMax || cap(pb.vecs) > publishPoolMaxVecs {
		return
	}
	pb.b = pb.b[:0]
	pb.vecs = pb.vecs[:0]
	pb.wv = nil
	publishBufs.Put(pb)
}

// publishFrames encodes and writes the publish, noting its send time in clock if any. A
// publish that was not written gives its confirmation tag back (unpublish), as upstream's
// does: the broker numbers only the publishes it received, so the next tag must be this one.
func (ch *Channel) publishFrames(exchange, key string, mandatory, immediate bool,
	msg *Publishing, clock *confirmClock) (*DeferredConfirmation, error) {
	if err := msg.Headers.Validate(); err != nil {
		return nil, err
	}
	pb := publishBufs.Get().(*publishBuf)
	defer putPublishBuf(pb)
	// Encoded before any lock, so other publishes of the channel do not wait for it; an
	// encoding error is reported after the closed checks, where upstream's send reports it.
	encErr := pb.encodeHead(ch.id, exchange, key, mandatory, immediate, msg)
	ch.m.Lock()
	defer ch.m.Unlock()
	dc := ch.nextConfirm(clock)
	if err := ch.sendPublish(pb, encErr, msg.Body); err != nil {
		if ch.confirming.Load() {
			ch.confirms.unpublish()
			if clock != nil && dc != nil {
				clock.unsent(dc.DeliveryTag)
			}
		}
		return nil, err
	}
	return dc, nil
}

// nextConfirm takes the next publish's confirmation, nil outside confirm mode; ch.m is held,
// so the tag it takes is the one the broker gives the publish written next on ch. Its pump
// (confirmPump) lets a waiter on the confirmation read in legacy mode.
func (ch *Channel) nextConfirm(clock *confirmClock) *DeferredConfirmation {
	if !ch.confirming.Load() {
		return nil
	}
	dc := ch.confirms.publish()
	dc.pump = ch.connection.confirmPump()
	if clock != nil {
		clock.sending(dc.DeliveryTag)
	}
	return dc
}

// sendPublish is upstream's send and sendOpen for a basic.publish; ch.m is held. The body
// frames are cut here, under ch.m, because the frame size is read under it as sendOpen
// reads it (Config.FrameSize, set by the handshake).
func (ch *Channel) sendPublish(pb *publishBuf, encErr error, body []byte) error {
	if err := ch.publishRefused(); err != nil {
		return err
	}
	err := encErr // a shortstr over 255 bytes fails the connection, as upstream
	if err == nil {
		pb.encodeBody(ch.id, body, ch.connection.bodyFrameSize(len(body)))
		err = ch.connection.writePublishVecs(pb.vecs, &pb.wv, len(pb.vecs), 1)
	}
	return ch.connection.publishWritten(err)
}

// publishRefused is upstream's closed checks for a publish, then ours; ch.m is held.
func (ch *Channel) publishRefused() error {
	c := ch.connection
	if ch.IsClosed() || c.IsClosed() {
		return ErrClosed // a closed channel sends only channel.close-ok
	}
	// Once Close began, the broker discards whatever follows its connection.close, so a
	// publish written now would be lost without an error: refuse it, as Close's waiters are.
	if c.rp != nil && isClosing(c.rp.base().calledC) {
		return ErrClosedIntentionally
	}
	return ch.midRecovery() // no publish inside recovery's handshake (recoverytags.go)
}

// publishWritten ends a write as upstream's send does: a failed write fails the connection
// (part of a frame may be on the wire, so nothing more can follow it); a written one tells
// upstream's heartbeater, through c.sends, that it need not send a heartbeat yet.
func (c *Connection) publishWritten(err error) error {
	if err != nil {
		// On its own goroutine: shutdown may re-enter through the notify chans.
		go c.shutdown(&Error{Code: FrameError, Reason: err.Error()})
		return err
	}
	select {
	case c.sends <- time.Now():
	default:
	}
	return nil
}

// bodyFrameSize is upstream's body frame size for a body of n bytes: the negotiated frame size
// less a frame's header and end (negotiateFrameSize), or the whole body in one frame when no
// size was negotiated. Positive unless n is 0.
func (c *Connection) bodyFrameSize(n int) int {
	if size := c.Config.FrameSize - frameHeaderSize; c.Config.FrameSize > 0 && size > 0 {
		return size
	}
	return n
}

// writePublishVecs writes n publishes' frames (writeVecs): through the group commit if
// coalescing, else at once under c.sendM. The caller holds ch.m.
func (c *Connection) writePublishVecs(vecs net.Buffers, wv *net.Buffers, maxVecs, n int) error {
	if c.rp != nil && c.rp.base().coalesce {
		return c.writeGroupedVecs(vecs, wv, maxVecs, n)
	}
	c.sendM.Lock()
	defer c.sendM.Unlock()
	return c.writeVecs(vecs, wv, maxVecs)
}

// publishOut is a generation's socket writer, set (with c.writer) and read under c.sendM.
// writeVecs writes to out only while buf is still c.writer's buffer: the two are set together
// when a generation starts, so a mismatch means c.writer belongs to another writer.
type publishOut struct {
	buf *bufio.Writer // the c.writer.w in front of out
	out *socketWriter
}

// writeVecs writes vecs after upstream's buffered frames, maxVecs buffers a vectored write,
// through *wv (the caller's, so no allocation), which the write consumes; the caller holds
// c.sendM. Upstream's frames go first because they were sent first: its sendUnflushed leaves
// frames in the bufio.Writer for a later flush.
func (c *Connection) writeVecs(vecs net.Buffers, wv *net.Buffers, maxVecs int) error {
	buf, _ := c.writer.w.(*bufio.Writer)
	if buf != nil {
		// Upstream's buffered frames first; this also returns bufio's sticky error.
		if err := buf.Flush(); err != nil {
			return err
		}
	}
	if c.rp == nil || buf == nil || c.rp.base().pub.buf != buf || c.rp.base().pub.out == nil {
		// Another writer (a test's, or a generation being replaced): the generation's socket
		// writer is not c.writer's, so write through c.writer, as upstream does.
		for _, v := range vecs {
			if _, err := c.writer.w.Write(v); err != nil {
				return err
			}
		}
		if buf != nil {
			return buf.Flush()
		}
		return nil
	}
	// The generation's socket writer: one writev per maxVecs buffers, each share handed to
	// the write in *wv, which the write consumes.
	for len(vecs) > 0 {
		n := min(len(vecs), maxVecs)
		*wv = vecs[:n:n]
		if _, err := c.rp.base().pub.out.writeVectors(wv); err != nil {
			return err
		}
		vecs = vecs[n:]
	}
	return nil
}

// encodeHead encodes the basic.publish and content header frames into pb.b, byte for byte as
// methodFrame.write and headerFrame.write do; on an error pb.b is left empty. The method frame
// is class 60, method 40, a reserved short, exchange and routing key as shortstrs, and one
// octet of bits (mandatory 1, immediate 2). The header frame is class 60, a zero weight, the
// body size as 64 bits, then the property flags and properties (appendProperties).
func (pb *publishBuf) encodeHead(channel uint16, exchange, key string,
	mandatory, immediate bool, msg *Publishing) (err error) {
	b := appendFrameStart(pb.b[:0], frameMethod, channel)
	b = append(b, 0, 60, 0, 40, 0, 0) // class basic, method publish, reserved1
	if b, err = appendShortstr(b, exchange); err == nil {
		b, err = appendShortstr(b, key)
	}
	if err == nil {
		b = appendFrameEnd(append(b, byte(flagIf(mandatory, 1)|flagIf(immediate, 2))), 0)
		start := len(b)
		b = appendFrameStart(b, frameHeader, channel)
		b = append(b, 0, 60, 0, 0) // class basic, weight
		b = binary.BigEndian.AppendUint64(b, uint64(len(msg.Body)))
		b, err = appendProperties(b, msg)
		b = appendFrameEnd(b, start)
	}
	if err != nil {
		b = b[:0]
	}
	pb.b = b
	pb.head = len(b)
	return err
}

// encodeBody appends the body frames, cut every size bytes as sendOpen cuts them, and sets
// pb.vecs to what goes to the socket: a small body (publishCopyMax) is copied into pb.b, a
// larger one is referenced between the frame headers and ends that pb.b holds.
func (pb *publishBuf) encodeBody(channel uint16, body []byte, size int) {
	b := pb.b[:pb.head]
	copyBody := len(body) <= publishCopyMax
	// Each body frame adds its header and frame-end (frameHeaderSize), and a copied body
	// adds itself.
	need := 0
	if len(body) > 0 {
		need = ((len(body)-1)/size + 1) * frameHeaderSize
	}
	if copyBody {
		need += len(body)
	}
	// Grow once, to what the frames need: at most one allocation per publish, however many
	// body frames it has.
	if cap(b)-len(b) < need {
		b = append(make([]byte, 0, len(b)+need), b...)
	}
	// A referenced body alternates in vecs with the parts of b around it: b up to and
	// including a frame's header, the body's slice, then (next round) its frame-end and the
	// next header. A copied body leaves b whole, one buffer.
	vecs := pb.vecs[:0]
	from := 0 // start of b not yet in vecs
	for i := 0; i < len(body); i += size {
		j := i + min(size, len(body)-i)
		b = appendFrameStart(b, frameBody, channel)
		binary.BigEndian.PutUint32(b[len(b)-4:], uint32(j-i))
		if copyBody {
			b = append(b, body[i:j]...)
		} else {
			vecs = append(vecs, b[from:], body[i:j])
			from = len(b)
		}
		b = append(b, frameEnd)
	}
	pb.b = b
	pb.vecs = append(vecs, b[from:])
}

// appendFrameStart appends a frame header (type, channel, a size of 0 for now) whose size
// appendFrameEnd sets once the payload is known.
func appendFrameStart(b []byte, typ uint8, channel uint16) []byte {
	return append(b, typ, byte(channel>>8), byte(channel), 0, 0, 0, 0)
}

// appendFrameEnd sets the frame's size (low 32 bits, as writeFrame) and appends frame-end.
func appendFrameEnd(b []byte, start int) []byte {
	binary.BigEndian.PutUint32(b[start+3:start+7], uint32(len(b)-start-7))
	return append(b, frameEnd)
}

// appendProperties is headerFrame.write's flags and properties, with its errors. The flags
// are a 16-bit mask written first and set last; each property present sets its bit and is
// appended in the spec's order, the order of the calls below, which the broker decodes by.
// An empty string or a zero value is absent, as upstream has it.
func appendProperties(b []byte, p *Publishing) ([]byte, error) {
	w := propWriter{b: append(b, 0, 0)} // the flags, set at the end
	w.str(flagContentType, p.ContentType)
	w.str(flagContentEncoding, p.ContentEncoding)
	if w.has(flagHeaders, len(p.Headers) > 0) && w.err == nil {
		w.b, w.err = appendTable(w.b, p.Headers)
	}
	if w.has(flagDeliveryMode, p.DeliveryMode > 0) {
		w.b = append(w.b, p.DeliveryMode)
	}
	if w.has(flagPriority, p.Priority > 0) {
		w.b = append(w.b, p.Priority)
	}
	w.str(flagCorrelationId, p.CorrelationId)
	w.str(flagReplyTo, p.ReplyTo)
	w.str(flagExpiration, p.Expiration)
	w.str(flagMessageId, p.MessageId)
	if w.has(flagTimestamp, !p.Timestamp.IsZero()) {
		w.b = binary.BigEndian.AppendUint64(w.b, uint64(p.Timestamp.Unix()))
	}
	w.str(flagType, p.Type)
	w.str(flagUserId, p.UserId)
	w.str(flagAppId, p.AppId)
	binary.BigEndian.PutUint16(w.b[len(b):], w.mask)
	return w.b, w.err
}

// propWriter is appendProperties' output, flags and first error: once a property failed to
// encode, the rest only set their flags, and the error is reported at the end.
type propWriter struct {
	b    []byte
	mask uint16
	err  error
}

// has adds flag to the mask if set, and returns set.
func (w *propWriter) has(flag uint16, set bool) bool {
	w.mask |= flagIf(set, flag)
	return set
}

// str appends the shortstr s, if not empty, unless something failed.
func (w *propWriter) str(flag uint16, s string) {
	if w.has(flag, s != "") && w.err == nil {
		w.b, w.err = appendShortstr(w.b, s)
	}
}

// flagIf is flag if set, else 0.
func flagIf(set bool, flag uint16) uint16 {
	if set {
		return flag
	}
	return 0
}

// appendShortstr is writeShortstr, with its error: a shortstr's length is one octet, so a
// longer string cannot be encoded. A single publish then fails the connection, as upstream's
// does; PublishBatch fails only the call.
func appendShortstr(b []byte, s string) ([]byte, error) {
	if len(s) > 255 {
		return b, fmt.Errorf("amqp: shortstr %q exceeds 255 bytes", s)
	}
	b = append(b, byte(len(s)))
	return append(b, s...), nil
}

// appendTable is writeTable, in the map's order, with its errors: a 32-bit size, then each
// key as a shortstr and each value as a field (appendField). Like upstream's, the order of
// the keys on the wire is the map's iteration order, which Go varies.
func appendTable(b []byte, table Table) (_ []byte, err error) {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	for key, val := range table {
		if b, err = appendShortstr(b, key); err != nil {
			return b, fmt.Errorf("writing key %q: %w", key, err)
		}
		if b, err = appendField(b, val); err != nil {
			return b, fmt.Errorf("writing value for key %q: %w", key, err)
		}
	}
	binary.BigEndian.PutUint32(b[start:start+4], uint32(len(b)-start-4))
	return b, nil
}

// appendField is writeField: same tags, truncations (int to 32 bits) and errors. A value of
// a type AMQP has no field for is ErrFieldType; Headers.Validate refused it before already.
func appendField(b []byte, value any) (_ []byte, err error) {
	switch v := value.(type) {
	case bool:
		b = append(b, 't', byte(flagIf(v, 1)))
	case byte:
		b = append(b, 'B', v)
	case int8:
		b = append(b, 'b', uint8(v))
	case int16:
		b = binary.BigEndian.AppendUint16(append(b, 's'), uint16(v))
	case int:
		b = binary.BigEndian.AppendUint32(append(b, 'I'), uint32(v))
	case int32:
		b = binary.BigEndian.AppendUint32(append(b, 'I'), uint32(v))
	case int64:
		b = binary.BigEndian.AppendUint64(append(b, 'l'), uint64(v))
	case uint16:
		b = binary.BigEndian.AppendUint16(append(b, 'u'), v)
	case uint32:
		b = binary.BigEndian.AppendUint32(append(b, 'i'), v)
	case float32:
		b = binary.BigEndian.AppendUint32(append(b, 'f'), math.Float32bits(v))
	case float64:
		b = binary.BigEndian.AppendUint64(append(b, 'd'), math.Float64bits(v))
	case Decimal:
		b = binary.BigEndian.AppendUint32(append(b, 'D', v.Scale), uint32(v.Value))
	case string:
		b = append(binary.BigEndian.AppendUint32(append(b, 'S'), uint32(len(v))), v...)
	case []any: // field-array
		start := len(b)
		b = append(b, 'A', 0, 0, 0, 0)
		for _, val := range v {
			if b, err = appendField(b, val); err != nil {
				return b, err
			}
		}
		binary.BigEndian.PutUint32(b[start+1:start+5], uint32(len(b)-start-5))
	case time.Time:
		b = binary.BigEndian.AppendUint64(append(b, 'T'), uint64(v.Unix()))
	case Table:
		return appendTable(append(b, 'F'), v)
	case []byte:
		b = append(binary.BigEndian.AppendUint32(append(b, 'x'), uint32(len(v))), v...)
	case nil:
		b = append(b, 'V')
	default:
		return b, ErrFieldType
	}
	return b, nil
}

// publishCtx is the hook in PublishWithContext, after its ctx check: publishDeferredCtx
// without the confirmation.
func (ch *Channel) publishCtx(ctx context.Context, exchange, key string,
	mandatory, immediate bool, msg Publishing) error {
	_, err := ch.publishDeferredCtx(ctx, exchange, key, mandatory, immediate, msg)
	return err
}

// publishDeferredCtx is the hook in PublishWithDeferredConfirmWithContext, after its ctx
// check. Upstream mode publishes as upstream; with a read path a publish first waits at the
// block gate (blockgate.go), where its ctx can end it, then takes the fast path: upstream's
// PublishWithDeferredConfirm (same checks, same order), encoded as the file comment says,
// with an Observer's publish hooks around it (observe_hooks.go).
func (ch *Channel) publishDeferredCtx(ctx context.Context, exchange, key string,
	mandatory, immediate bool, msg Publishing) (*DeferredConfirmation, error) {
	if ch.connection.rp == nil {
		return ch.PublishWithDeferredConfirm(exchange, key, mandatory, immediate, msg)
	}
	if err := ch.connection.rp.base().blocks.wait(ctx); err != nil {
		return nil, err
	}
	if o := ch.connection.obsOf(); o != nil {
		return ch.publishObserved(ctx, o, exchange, key, mandatory, immediate, &msg)
	}
	return ch.publishFrames(exchange, key, mandatory, immediate, &msg, nil)
}

// BatchPublishing is one message of a PublishBatch.
type BatchPublishing struct {
	Exchange, Key        string // as PublishWithContext takes them
	Mandatory, Immediate bool
	Msg                  Publishing
}

// PublishBatch publishes batch in order, as PublishWithDeferredConfirmWithContext would one by
// one, but in one write under the channel's lock, which no other publish of the channel enters:
// with a read path one writev (split past 1,000 buffers), in upstream mode upstream's buffered
// writer. Every message is encoded first: one that cannot be (a Headers value of an unsupported
// type, a shortstr over 255 bytes) fails the call, naming its index and wrapping the encoder's
// error, and nothing is sent (the connection stays open). A done ctx returns ctx.Err(), and
// with a read path ends a wait while the broker blocks the connection. An empty batch sends
// nothing; a closed channel or connection returns ErrClosed. An Observer sees each message.
//
// In confirm mode it returns one DeferredConfirmation per message, in order. A failed write
// fails the connection, as a single publish's does, and returns its error, wrapped, with the
// confirmations, as part of the batch may have gone out: each resolves as the connection ends,
// acked if the broker acked it first, else nacked, as upstream resolves every outstanding one.
//
//	batch := []amqp.BatchPublishing{{Key: "jobs", Msg: amqp.Publishing{Body: b}}}
//	dcs, err := ch.PublishBatch(ctx, batch)
func (ch *Channel) PublishBatch(ctx context.Context,
	batch []BatchPublishing) ([]*DeferredConfirmation, error) {
	// An empty batch is a no-op, and an ended ctx sends nothing, as PublishWithContext's.
	if len(batch) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if rp := ch.connection.rp; rp != nil {
		if err := rp.base().blocks.wait(ctx); err != nil {
			return nil, err
		}
	}
	o := ch.connection.obsOf()
	if o == nil { // upstream mode, or no Observer
		return ch.publishBatch(batch, nil)
	}
	// With an Observer: BeforePublish sees each message (a copy it may change) first, then
	// the batch is written, then Published reports each with its tag and the batch's error.
	infos := make([]PublishInfo, len(batch))
	ctxs := make([]context.Context, len(batch))
	batch = append([]BatchPublishing(nil), batch...) // the copies that BeforePublish may change
	for i := range batch {
		p := &batch[i]
		infos[i] = PublishInfo{Channel: ch.id, Exchange: p.Exchange, RoutingKey: p.Key,
			Mandatory: p.Mandatory, BodySize: len(p.Msg.Body)}
		ctxs[i] = ctx
		if o.BeforePublish != nil {
			ctxs[i] = o.BeforePublish(ctx, infos[i], &p.Msg)
		}
	}
	dcs, err := ch.publishBatch(batch, ch.clockOf())
	for i := 0; o.Published != nil && i < len(batch); i++ {
		if dcs != nil {
			infos[i].DeliveryTag = dcs[i].DeliveryTag
		}
		o.Published(ctxs[i], infos[i], err)
	}
	return dcs, err
}

// publishBatch is PublishBatch after the gate and the Observer, noting send times in clock if
// any. Every message is encoded before ch.m, so a bad one fails the call with nothing sent;
// under ch.m the tags are handed out and the write made, as for a single publish.
func (ch *Channel) publishBatch(batch []BatchPublishing,
	clock *confirmClock) ([]*DeferredConfirmation, error) {
	pbs := make([]*publishBuf, 0, len(batch))
	defer func() {
		for _, pb := range pbs {
			putPublishBuf(pb)
		}
	}()
	for i := range batch {
		p := &batch[i]
		pb := publishBufs.Get().(*publishBuf)
		pbs = append(pbs, pb)
		err := p.Msg.Headers.Validate()
		if err == nil {
			err = pb.encodeHead(ch.id, p.Exchange, p.Key, p.Mandatory, p.Immediate, &p.Msg)
		}
		if err != nil {
			return nil, fmt.Errorf("amqp: PublishBatch: message %d of %d: %w", i, len(batch), err)
		}
	}
	c := ch.connection
	ch.m.Lock()
	defer ch.m.Unlock()
	if err := ch.publishRefused(); err != nil {
		return nil, err
	}
	vecs := make(net.Buffers, 0, len(batch))
	for i, pb := range pbs {
		body := batch[i].Msg.Body
		pb.encodeBody(ch.id, body, c.bodyFrameSize(len(body)))
		vecs = append(vecs, pb.vecs...)
	}
	// The tags are taken before the write, under the ch.m that the write holds too, as a
	// single publish takes its own: in order, with no other publish of ch in between.
	var dcs []*DeferredConfirmation
	if ch.confirming.Load() {
		dcs = make([]*DeferredConfirmation, len(batch))
		for i := range dcs {
			dcs[i] = ch.nextConfirm(clock)
		}
	}
	var wv net.Buffers
	err := c.publishWritten(c.writePublishVecs(vecs, &wv, groupMaxVecs, len(batch)))
	if err != nil {
		return dcs, fmt.Errorf("amqp: PublishBatch: the write of %d messages failed, "+
			"some may have gone out: %w", len(batch), err)
	}
	return dcs, nil
}
