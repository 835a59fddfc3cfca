// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

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

// The publish fast path of the drainer and legacy modes.
//
// Upstream encodes a publish frame by frame: each frame is built in a fresh
// bytes.Buffer through binary.Write (reflection), the connection's write
// lock is taken and released per frame, and the body is copied into the
// bufio.Writer in front of the socket. That is 29 allocations per publish
// and a copy of every body byte.
//
// Here the method frame, the content header frame and the octets around
// each body frame are appended to one pooled buffer before any lock is
// taken; under the write lock the body goes to the socket as it is, beside
// that buffer, in one vectored write (writev on TCP). The bytes on the wire
// are exactly upstream's (publish_test.go compares them), and so are the
// errors and what an error does to the channel and the connection, with one
// difference: a publish that cannot be encoded writes nothing, where
// upstream writes the frames before the one that failed.
//
// Only PublishWithContext and PublishWithDeferredConfirmWithContext come
// here, through publishCtx and publishDeferredCtx, and only when the
// connection has a read path: without one, upstream's code runs.

// publishCopyMax is the largest body that is copied into the pooled buffer
// so that the whole publish is one contiguous write. A small copy is cheap
// next to a write call, and on transports that cannot write vectors (TLS)
// it saves a Write (a TLS record) for the body and one for the frame-end;
// larger bodies go uncopied. 2 KiB is a judgement, not a measured optimum:
// the micro-benchmark's sink cannot write vectors and so cannot tell.
const publishCopyMax = 2048

// publishPoolMax bounds the buffers kept in the pool: a publish with a huge
// header table or a huge body split in many frames grows its buffer, which
// is then dropped rather than kept for the life of the process.
const (
	publishPoolMax     = 64 << 10
	publishPoolMaxVecs = 256
)

// publishBuf is one publish's encoding, reused through publishBufs.
type publishBuf struct {
	b    []byte      // the encoded frames; bodies up to publishCopyMax too
	head int         // len(b) after the method and header frames
	vecs [][]byte    // what goes to the socket, in order: parts of b and of the body
	wv   net.Buffers // the copy of vecs that a vectored write consumes
	wvs  [][]byte    // wv's array, which the write leaves behind
}

var publishBufs = sync.Pool{New: func() any {
	return &publishBuf{b: make([]byte, 0, 512), vecs: make([][]byte, 0, 8)}
}}

func getPublishBuf() *publishBuf { return publishBufs.Get().(*publishBuf) }

func putPublishBuf(pb *publishBuf) {
	// Drop the references to the caller's body before pooling.
	for i := range pb.vecs {
		pb.vecs[i] = nil
	}
	for i := range pb.wvs {
		pb.wvs[i] = nil
	}
	if cap(pb.b) > publishPoolMax || cap(pb.vecs) > publishPoolMaxVecs {
		return
	}
	pb.b, pb.vecs, pb.wv, pb.wvs = pb.b[:0], pb.vecs[:0], nil, pb.wvs[:0]
	publishBufs.Put(pb)
}

// publishFast is upstream's PublishWithDeferredConfirm with the encoding
// above. Header validation, confirm bookkeeping, the checks of a closed
// channel and connection and their order are upstream's.
func (ch *Channel) publishFast(ctx context.Context, exchange, key string, mandatory, immediate bool, msg *Publishing) (*DeferredConfirmation, error) {
	if o := ch.connection.obsOf(); o != nil {
		return ch.publishObserved(ctx, o, exchange, key, mandatory, immediate, msg)
	}
	return ch.publishFrames(exchange, key, mandatory, immediate, msg, nil)
}

// publishFrames encodes and writes the publish, recording its delivery
// tag's send time in clock if there is one.
func (ch *Channel) publishFrames(exchange, key string, mandatory, immediate bool, msg *Publishing, clock *confirmClock) (*DeferredConfirmation, error) {
	if err := msg.Headers.Validate(); err != nil {
		return nil, err
	}

	// The method and header frames depend only on the arguments: encode
	// them before taking any lock. An error is reported where upstream
	// would report it, after the closed checks.
	pb := getPublishBuf()
	defer putPublishBuf(pb)
	encErr := pb.encodeHead(ch.id, exchange, key, mandatory, immediate, msg)

	ch.m.Lock()
	defer ch.m.Unlock()

	var dc *DeferredConfirmation
	if ch.confirming.Load() {
		dc = ch.confirms.publish()
		dc.pump = ch.connection.confirmPump()
		if clock != nil {
			clock.sending(dc.DeliveryTag)
		}
	}

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

// sendPublish is upstream's send and sendOpen for a basic.publish: the
// caller holds ch.m.
func (ch *Channel) sendPublish(pb *publishBuf, encErr error, body []byte) error {
	if err := ch.publishRefused(); err != nil {
		return err
	}
	c := ch.connection
	if encErr != nil {
		// Upstream fails the connection when a frame cannot be encoded (a
		// shortstr over 255 bytes), after writing the frames before it;
		// here nothing of the message is written.
		go c.shutdown(&Error{
			Code:   FrameError,
			Reason: encErr.Error(),
		})
		return encErr
	}
	pb.encodeBody(ch.id, body, c.bodyFrameSize(len(body)))
	if err := c.writePublishBuf(pb); err != nil {
		// shutdown could be re-entrant from signaling notify chans
		go c.shutdown(&Error{
			Code:   FrameError,
			Reason: err.Error(),
		})
		return err
	}

	// Broadcast we sent a frame, reducing heartbeats, as upstream's flush
	// does after a publish.
	select {
	case c.sends <- time.Now():
	default:
	}
	return nil
}

// publishRefused is why a publish on ch may not be written now, in the
// order upstream checks, then ours; nil when it may.
func (ch *Channel) publishRefused() error {
	// A closed channel sends only channel.close-ok (sendClosed).
	if ch.IsClosed() || ch.connection.IsClosed() {
		return ErrClosed
	}
	// Once the application has called Close, the broker discards what
	// follows connection.close: refuse the message rather than write it
	// for nobody, so Close does not compete with a publisher for the
	// broker's time (consumeloop.go).
	if isClosing(ch.connection.rp.base().calledC) {
		return ErrClosedIntentionally
	}
	// A read path keeps tags unique: no publish inside recovery's
	// handshake (recoverytags.go).
	return ch.midRecovery()
}

// bodyFrameSize is upstream's body frame size for a body of n bytes.
// negotiateFrameSize keeps FrameSize 0 or at least frameMinSize, so the
// size is positive unless the body is empty.
func (c *Connection) bodyFrameSize(n int) int {
	if size := c.Config.FrameSize - frameHeaderSize; c.Config.FrameSize > 0 && size > 0 {
		return size
	}
	return n
}

// writePublishBuf writes pb's frames: through the group commit when the
// read path coalesces publishes (groupcommit.go), under sendM otherwise.
func (c *Connection) writePublishBuf(pb *publishBuf) error {
	if c.rp.base().coalesce {
		return c.writePublishGrouped(pb)
	}
	c.sendM.Lock()
	defer c.sendM.Unlock()
	return c.writePublish(pb)
}

// vectorWriter is the socket writer of a read path's generation: it writes
// v, consuming it, with the accounting its Write does.
type vectorWriter interface {
	writeVectors(v *net.Buffers) (int64, error)
}

// publishOut is where a read path keeps its generation's socket writer for
// the publish fast path. Both fields are set together under c.sendM, where
// the read path sets c.writer, and read under c.sendM.
type publishOut struct {
	buf *bufio.Writer // the c.writer.w in front of out
	out vectorWriter
}

// writePublish writes pb's frames; the caller holds c.sendM.
func (c *Connection) writePublish(pb *publishBuf) error {
	buf, _ := c.writer.w.(*bufio.Writer)
	if buf != nil {
		// Frames buffered by upstream's write path go first; this also
		// returns a previous write's error, which bufio keeps.
		if err := buf.Flush(); err != nil {
			return err
		}
	}

	if c.rp != nil && buf != nil {
		if out := &c.rp.base().pub; out.buf == buf && out.out != nil {
			// The write consumes pb.wv, leaving it empty at the end of its
			// array: wvs keeps the array for the next publish.
			pb.wv = append(pb.wvs[:0], pb.vecs...)
			pb.wvs = pb.wv
			_, err := out.out.writeVectors(&pb.wv)
			return err
		}
	}

	// Another writer (a test's read path, or a generation being replaced):
	// through c.writer as upstream writes.
	return c.writeThrough(pb.vecs, buf)
}

// writeThrough writes vecs through c.writer, as upstream writes, and
// flushes buf if there is one; the caller holds c.sendM.
func (c *Connection) writeThrough(vecs net.Buffers, buf *bufio.Writer) error {
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

// encodeHead appends the basic.publish method frame and the content header
// frame for msg, as upstream's methodFrame.write and headerFrame.write
// encode them, and returns their error, if any.
func (pb *publishBuf) encodeHead(channel uint16, exchange, key string, mandatory, immediate bool, msg *Publishing) (err error) {
	b := pb.b[:0]

	// basic.publish
	start := len(b)
	b = appendFrameStart(b, frameMethod, channel)
	b = binary.BigEndian.AppendUint16(b, 60) // class basic
	b = binary.BigEndian.AppendUint16(b, 40) // method publish
	b = binary.BigEndian.AppendUint16(b, 0)  // reserved1
	if b, err = appendShortstr(b, exchange); err != nil {
		pb.b = b[:0]
		return err
	}
	if b, err = appendShortstr(b, key); err != nil {
		pb.b = b[:0]
		return err
	}
	var bits byte
	if mandatory {
		bits |= 1 << 0
	}
	if immediate {
		bits |= 1 << 1
	}
	b = append(b, bits)
	b = appendFrameEnd(b, start)

	// content header
	start = len(b)
	b = appendFrameStart(b, frameHeader, channel)
	b = binary.BigEndian.AppendUint16(b, 60) // class basic
	b = binary.BigEndian.AppendUint16(b, 0)  // weight
	b = binary.BigEndian.AppendUint64(b, uint64(len(msg.Body)))
	if b, err = appendProperties(b, msg); err != nil {
		pb.b = b[:0]
		return err
	}
	b = appendFrameEnd(b, start)

	pb.b = b
	pb.head = len(b)
	return nil
}

// encodeBody appends the body frames, in chunks of size as upstream's
// sendOpen cuts them, and sets pb.vecs to the whole publish.
func (pb *publishBuf) encodeBody(channel uint16, body []byte, size int) {
	b := pb.b[:pb.head]
	copyBody := len(body) <= publishCopyMax
	frames := 0
	if len(body) > 0 {
		frames = (len(body)-1)/size + 1
	}

	// Grow once, so that the slices of b taken below stay valid.
	need := frames * (frameHeaderSize)
	if copyBody {
		need += len(body)
	}
	if cap(b)-len(b) < need {
		nb := make([]byte, len(b), len(b)+need)
		copy(nb, b)
		b = nb
	}

	vecs := pb.vecs[:0]
	from := 0 // start of b not yet in vecs
	for i := 0; i < len(body); i += size {
		j := len(body)
		if size < j-i {
			j = i + size
		}
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
	vecs = append(vecs, b[from:])
	pb.b, pb.vecs = b, vecs
}

// appendFrameStart appends a frame's type, channel and a size that
// appendFrameEnd fills in.
func appendFrameStart(b []byte, typ uint8, channel uint16) []byte {
	return append(b, typ, byte(channel>>8), byte(channel), 0, 0, 0, 0)
}

// appendFrameEnd sets the size of the frame that starts at start, as
// upstream's writeFrame does (the low 32 bits), and appends the frame-end.
func appendFrameEnd(b []byte, start int) []byte {
	binary.BigEndian.PutUint32(b[start+3:start+7], uint32(len(b)-start-7))
	return append(b, frameEnd)
}

// appendProperties is headerFrame.write's flags and property list.
func appendProperties(b []byte, p *Publishing) (_ []byte, err error) {
	var mask uint16

	if p.ContentType != "" {
		mask |= flagContentType
	}
	if p.ContentEncoding != "" {
		mask |= flagContentEncoding
	}
	if len(p.Headers) > 0 {
		mask |= flagHeaders
	}
	if p.DeliveryMode > 0 {
		mask |= flagDeliveryMode
	}
	if p.Priority > 0 {
		mask |= flagPriority
	}
	if p.CorrelationId != "" {
		mask |= flagCorrelationId
	}
	if p.ReplyTo != "" {
		mask |= flagReplyTo
	}
	if p.Expiration != "" {
		mask |= flagExpiration
	}
	if p.MessageId != "" {
		mask |= flagMessageId
	}
	if !p.Timestamp.IsZero() {
		mask |= flagTimestamp
	}
	if p.Type != "" {
		mask |= flagType
	}
	if p.UserId != "" {
		mask |= flagUserId
	}
	if p.AppId != "" {
		mask |= flagAppId
	}

	b = binary.BigEndian.AppendUint16(b, mask)

	if hasProperty(mask, flagContentType) {
		if b, err = appendShortstr(b, p.ContentType); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagContentEncoding) {
		if b, err = appendShortstr(b, p.ContentEncoding); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagHeaders) {
		if b, err = appendTable(b, p.Headers); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagDeliveryMode) {
		b = append(b, p.DeliveryMode)
	}
	if hasProperty(mask, flagPriority) {
		b = append(b, p.Priority)
	}
	if hasProperty(mask, flagCorrelationId) {
		if b, err = appendShortstr(b, p.CorrelationId); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagReplyTo) {
		if b, err = appendShortstr(b, p.ReplyTo); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagExpiration) {
		if b, err = appendShortstr(b, p.Expiration); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagMessageId) {
		if b, err = appendShortstr(b, p.MessageId); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagTimestamp) {
		b = binary.BigEndian.AppendUint64(b, uint64(p.Timestamp.Unix()))
	}
	if hasProperty(mask, flagType) {
		if b, err = appendShortstr(b, p.Type); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagUserId) {
		if b, err = appendShortstr(b, p.UserId); err != nil {
			return b, err
		}
	}
	if hasProperty(mask, flagAppId) {
		if b, err = appendShortstr(b, p.AppId); err != nil {
			return b, err
		}
	}

	return b, nil
}

// appendShortstr is writeShortstr, with its error.
func appendShortstr(b []byte, s string) ([]byte, error) {
	if len(s) > 255 {
		return b, fmt.Errorf("amqp: shortstr %q exceeds 255 bytes", s)
	}
	b = append(b, byte(len(s)))
	return append(b, s...), nil
}

// appendTable is writeTable: a longstr of key and field pairs, in the
// map's order, with writeTable's errors.
func appendTable(b []byte, table Table) ([]byte, error) {
	start := len(b)
	b = append(b, 0, 0, 0, 0)

	var err error
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

// appendField is writeField: the same tags for the same Go types, the same
// truncations (int to 32 bits), the same errors.
func appendField(b []byte, value any) (_ []byte, err error) {
	switch v := value.(type) {
	case bool:
		if v {
			b = append(b, 't', 1)
		} else {
			b = append(b, 't', 0)
		}

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
		b = binary.BigEndian.AppendUint32(append(b, 'S'), uint32(len(v)))
		b = append(b, v...)

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
		b = binary.BigEndian.AppendUint32(append(b, 'x'), uint32(len(v)))
		b = append(b, v...)

	case nil:
		b = append(b, 'V')

	default:
		return b, ErrFieldType
	}

	return b, nil
}

// publishCtx and publishDeferredCtx are the hooks in PublishWithContext and
// PublishWithDeferredConfirmWithContext, after their own ctx check: with a
// read path they wait at its block gate, then publish through the fast
// path; without one they publish as upstream.
func (ch *Channel) publishCtx(ctx context.Context, exchange, key string, mandatory, immediate bool, msg Publishing) error {
	if err := ch.connection.publishWait(ctx); err != nil {
		return err
	}
	if ch.connection.rp != nil {
		_, err := ch.publishFast(ctx, exchange, key, mandatory, immediate, &msg)
		return err
	}
	return ch.Publish(exchange, key, mandatory, immediate, msg)
}

func (ch *Channel) publishDeferredCtx(ctx context.Context, exchange, key string, mandatory, immediate bool, msg Publishing) (*DeferredConfirmation, error) {
	if err := ch.connection.publishWait(ctx); err != nil {
		return nil, err
	}
	if ch.connection.rp != nil {
		return ch.publishFast(ctx, exchange, key, mandatory, immediate, &msg)
	}
	return ch.PublishWithDeferredConfirm(exchange, key, mandatory, immediate, msg)
}

// publishWait holds a publish while the broker blocks the connection
// (blockgate.go); it does nothing without a read path.
func (c *Connection) publishWait(ctx context.Context) error {
	if c.rp == nil {
		return nil
	}
	return c.rp.base().blocks.wait(ctx)
}
