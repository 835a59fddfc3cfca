// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// upstreamPublishBytes is what upstream's sendOpen writes for a publish,
// frame by frame through upstream's encoders, stopping at the first error
// as sendOpen does.
func upstreamPublishBytes(channel uint16, exchange, key string, mandatory, immediate bool, msg Publishing, frameSize int) ([]byte, error) {
	var buf bytes.Buffer
	w := &writer{&buf}
	pub := &basicPublish{
		Exchange:   exchange,
		RoutingKey: key,
		Mandatory:  mandatory,
		Immediate:  immediate,
		Body:       msg.Body,
		Properties: properties{
			Headers:         msg.Headers,
			ContentType:     msg.ContentType,
			ContentEncoding: msg.ContentEncoding,
			DeliveryMode:    msg.DeliveryMode,
			Priority:        msg.Priority,
			CorrelationId:   msg.CorrelationId,
			ReplyTo:         msg.ReplyTo,
			Expiration:      msg.Expiration,
			MessageId:       msg.MessageId,
			Timestamp:       msg.Timestamp,
			Type:            msg.Type,
			UserId:          msg.UserId,
			AppId:           msg.AppId,
		},
	}
	props, body := pub.getContent()
	class, _ := pub.id()
	size := len(body)
	if frameSize > 0 {
		size = frameSize - frameHeaderSize
	}
	if err := w.WriteFrameNoFlush(&methodFrame{ChannelId: channel, Method: pub}); err != nil {
		return buf.Bytes(), err
	}
	if err := w.WriteFrameNoFlush(&headerFrame{ChannelId: channel, ClassId: class, Size: uint64(len(body)), Properties: props}); err != nil {
		return buf.Bytes(), err
	}
	for i, j := 0, size; i < len(body); i, j = j, j+size {
		if j > len(body) {
			j = len(body)
		}
		if err := w.WriteFrameNoFlush(&bodyFrame{ChannelId: channel, Body: body[i:j]}); err != nil {
			return buf.Bytes(), err
		}
	}
	return buf.Bytes(), nil
}

// fastPublishBytes is what publish.go writes for the same publish.
func fastPublishBytes(channel uint16, exchange, key string, mandatory, immediate bool, msg Publishing, frameSize int) ([]byte, error) {
	pb := publishBufs.Get().(*publishBuf)
	defer putPublishBuf(pb)
	if err := pb.encodeHead(channel, exchange, key, mandatory, immediate, &msg); err != nil {
		return nil, err
	}
	size := len(msg.Body)
	if frameSize > 0 {
		size = frameSize - frameHeaderSize
	}
	pb.encodeBody(channel, msg.Body, size)
	var out []byte
	for _, v := range pb.vecs {
		out = append(out, v...)
	}
	return out, nil
}

// comparePublishBytes fails unless got and want are the same frames. Field
// tables are compared with their entries sorted by key, since both encoders
// write a table in Go's map order, which varies between runs.
func comparePublishBytes(t testing.TB, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	cg, errG := canonFrames(got)
	cw, errW := canonFrames(want)
	if errG != nil || errW != nil {
		t.Fatalf("unparsable frames: fast path %v, upstream %v\nfast:     %x\nupstream: %x", errG, errW, got, want)
	}
	if len(got) != len(want) || !bytes.Equal(cg, cw) {
		t.Fatalf("frames differ\nfast:     %x\nupstream: %x", got, want)
	}
}

// canonFrames returns frames with the header table of each content header
// frame in canonical order; it checks each frame's size and frame-end.
func canonFrames(b []byte) ([]byte, error) {
	var out []byte
	for len(b) > 0 {
		if len(b) < 8 {
			return nil, errors.New("short frame")
		}
		size := int(binary.BigEndian.Uint32(b[3:7]))
		if len(b) < size+8 || b[size+7] != frameEnd {
			return nil, errors.New("bad frame size or end")
		}
		payload := b[7 : 7+size]
		if b[0] == frameHeader {
			var err error
			if payload, err = canonHeaderPayload(payload); err != nil {
				return nil, err
			}
		}
		out = append(out, b[:7]...)
		out = append(out, payload...)
		out = append(out, frameEnd)
		b = b[size+8:]
	}
	return out, nil
}

func canonHeaderPayload(p []byte) ([]byte, error) {
	if len(p) < 14 {
		return nil, errors.New("short header")
	}
	flags := binary.BigEndian.Uint16(p[12:14])
	if flags&flagHeaders == 0 {
		return p, nil
	}
	off := 14
	for _, f := range []uint16{flagContentType, flagContentEncoding} {
		if flags&f != 0 {
			if off >= len(p) {
				return nil, errors.New("short property")
			}
			off += 1 + int(p[off])
		}
	}
	if off > len(p) {
		return nil, errors.New("short property")
	}
	table, rest, err := canonTable(p[off:])
	if err != nil {
		return nil, err
	}
	out := append([]byte{}, p[:off]...)
	out = append(out, table...)
	return append(out, rest...), nil
}

// canonTable re-encodes the field table at the start of b with its entries
// sorted by key, recursively, and returns the rest of b.
func canonTable(b []byte) (table, rest []byte, err error) {
	if len(b) < 4 {
		return nil, nil, errors.New("short table")
	}
	n := int(binary.BigEndian.Uint32(b))
	if len(b) < 4+n {
		return nil, nil, errors.New("short table")
	}
	body, rest := b[4:4+n], b[4+n:]
	var entries [][]byte
	for len(body) > 0 {
		kl := int(body[0])
		if len(body) < 1+kl {
			return nil, nil, errors.New("short key")
		}
		entry := append([]byte{}, body[:1+kl]...)
		var field []byte
		if field, body, err = canonField(body[1+kl:]); err != nil {
			return nil, nil, err
		}
		entries = append(entries, append(entry, field...))
	}
	sort.Slice(entries, func(i, j int) bool {
		ki, kj := entries[i][1:1+int(entries[i][0])], entries[j][1:1+int(entries[j][0])]
		return bytes.Compare(ki, kj) < 0
	})
	table = binary.BigEndian.AppendUint32(nil, uint32(n))
	for _, e := range entries {
		table = append(table, e...)
	}
	return table, rest, nil
}

func canonField(b []byte) (field, rest []byte, err error) {
	if len(b) == 0 {
		return nil, nil, errors.New("short field")
	}
	fixed := map[byte]int{'t': 2, 'B': 2, 'b': 2, 's': 3, 'u': 3, 'I': 5, 'i': 5, 'f': 5, 'D': 6, 'l': 9, 'd': 9, 'T': 9, 'V': 1}
	if n, ok := fixed[b[0]]; ok {
		if len(b) < n {
			return nil, nil, errors.New("short field")
		}
		return b[:n], b[n:], nil
	}
	switch b[0] {
	case 'S', 'x':
		if len(b) < 5 || len(b) < 5+int(binary.BigEndian.Uint32(b[1:])) {
			return nil, nil, errors.New("short string")
		}
		n := 5 + int(binary.BigEndian.Uint32(b[1:]))
		return b[:n], b[n:], nil
	case 'F':
		table, rest, err := canonTable(b[1:])
		if err != nil {
			return nil, nil, err
		}
		return append([]byte{'F'}, table...), rest, nil
	case 'A':
		if len(b) < 5 || len(b) < 5+int(binary.BigEndian.Uint32(b[1:])) {
			return nil, nil, errors.New("short array")
		}
		n := 5 + int(binary.BigEndian.Uint32(b[1:]))
		out := append([]byte{}, b[:5]...)
		for elems := b[5:n]; len(elems) > 0; {
			var f []byte
			if f, elems, err = canonField(elems); err != nil {
				return nil, nil, err
			}
			out = append(out, f...)
		}
		return out, b[n:], nil
	}
	return nil, nil, fmt.Errorf("unknown field tag %q", b[0])
}

// checkPublishEncoding encodes one publish both ways and fails on any
// difference: bytes, or whether and why it fails.
func checkPublishEncoding(t testing.TB, channel uint16, exchange, key string, mandatory, immediate bool, msg Publishing, frameSize int) {
	t.Helper()
	if err := msg.Headers.Validate(); err != nil {
		return // both paths start with this same call, and stop there
	}
	want, wantErr := upstreamPublishBytes(channel, exchange, key, mandatory, immediate, msg, frameSize)
	got, gotErr := fastPublishBytes(channel, exchange, key, mandatory, immediate, msg, frameSize)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("error: fast path %v, upstream %v", gotErr, wantErr)
	}
	if wantErr != nil {
		// The same failure; which one when several strings are too long
		// depends on map order.
		if strings.Contains(gotErr.Error(), "exceeds 255 bytes") != strings.Contains(wantErr.Error(), "exceeds 255 bytes") ||
			errors.Is(gotErr, ErrFieldType) != errors.Is(wantErr, ErrFieldType) {
			t.Fatalf("error: fast path %v, upstream %v", gotErr, wantErr)
		}
		if got != nil {
			t.Fatalf("fast path encoded %d bytes with an error", len(got))
		}
		return
	}
	comparePublishBytes(t, got, want)
}

// everyField is a table holding one value of every type writeField encodes.
func everyField() Table {
	return Table{
		"bool": true, "false": false, "byte": byte(200), "int8": int8(-3), "int16": int16(-300),
		"int": -70000, "int32": int32(1 << 30), "int64": int64(-1 << 40), "uint16": uint16(65000),
		"uint32": uint32(4000000000), "float32": float32(1.5), "float64": math.Inf(-1),
		"decimal": Decimal{Scale: 3, Value: -12345}, "string": "héllo", "bytes": []byte{0, 1, 2},
		"nil": nil, "time": time.Unix(1700000000, 999), "array": []any{int32(1), "two", []any{nil}, Table{"k": "v"}},
		"table": Table{"inner": Table{"deep": int64(7)}, "empty": Table{}}, "emptyArray": []any{}, "nilBytes": []byte(nil),
	}
}

func TestPublishEncodingMatchesUpstream(t *testing.T) {
	full := Publishing{
		Headers:         everyField(),
		ContentType:     "application/json",
		ContentEncoding: "utf-8",
		DeliveryMode:    Persistent,
		Priority:        9,
		CorrelationId:   "corr",
		ReplyTo:         "reply",
		Expiration:      "60000",
		MessageId:       "id-1",
		Timestamp:       time.Unix(1234567890, 0),
		Type:            "type",
		UserId:          "guest",
		AppId:           "app",
	}
	for _, frameSize := range []int{0, 9, 100, frameMinSize, 131072} {
		for _, n := range []int{0, 1, 7, 43, publishCopyMax, publishCopyMax + 1, frameMinSize - frameHeaderSize,
			frameMinSize - frameHeaderSize + 1, 3*(frameMinSize-frameHeaderSize) + 5, 70000} {
			if frameSize == 9 && n > 5000 {
				continue // a frame per byte: slow, and no different
			}
			body := make([]byte, n)
			for i := range body {
				body[i] = byte(i * 7)
			}
			for _, msg := range []Publishing{{}, {Body: body}, func() Publishing { m := full; m.Body = body; return m }()} {
				msg := msg
				t.Run(fmt.Sprintf("frame=%d/body=%d/props=%t", frameSize, n, msg.ContentType != ""), func(t *testing.T) {
					checkPublishEncoding(t, 7, "exchange", "routing.key", true, false, msg, frameSize)
					checkPublishEncoding(t, 65535, "", "", false, true, msg, frameSize)
				})
			}
		}
	}
}

// TestPublishEncodingErrorsMatchUpstream: every string upstream refuses
// gives upstream's error, word for word, and the fast path encodes nothing.
func TestPublishEncodingErrorsMatchUpstream(t *testing.T) {
	long := strings.Repeat("x", 256)
	cases := map[string]struct {
		exchange, key string
		msg           Publishing
	}{
		"exchange":        {exchange: long},
		"key":             {key: long},
		"content type":    {msg: Publishing{ContentType: long}},
		"app id":          {msg: Publishing{AppId: long}},
		"user id":         {msg: Publishing{UserId: long}},
		"header key":      {msg: Publishing{Headers: Table{long: 1}}},
		"nested key":      {msg: Publishing{Headers: Table{"a": Table{long: 1}}}},
		"key in array":    {msg: Publishing{Headers: Table{"a": []any{1, Table{long: "v"}}}}},
		"255 bytes is ok": {exchange: long[:255], key: long[:255], msg: Publishing{Type: long[:255], Headers: Table{long[:255]: long}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, wantErr := upstreamPublishBytes(1, c.exchange, c.key, false, false, c.msg, 0)
			got, gotErr := fastPublishBytes(1, c.exchange, c.key, false, false, c.msg, 0)
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("error: fast path %v, upstream %v", gotErr, wantErr)
			}
			if gotErr != nil && got != nil {
				t.Fatalf("fast path encoded %d bytes with an error", len(got))
			}
			checkPublishEncoding(t, 1, c.exchange, c.key, false, false, c.msg, 0)
		})
	}
}

// publishGen turns fuzz input into publishes.
type publishGen struct{ b []byte }

func (g *publishGen) byte() byte {
	if len(g.b) == 0 {
		return 0
	}
	c := g.b[0]
	g.b = g.b[1:]
	return c
}

func (g *publishGen) uint16() uint16 { return uint16(g.byte())<<8 | uint16(g.byte()) }

func (g *publishGen) uint64() uint64 {
	var v uint64
	for i := 0; i < 8; i++ {
		v = v<<8 | uint64(g.byte())
	}
	return v
}

// str is empty half the time, and longer than a shortstr allows sometimes.
func (g *publishGen) str() string {
	n := int(g.byte())
	if n&1 == 0 {
		return ""
	}
	if n > 250 {
		n += int(g.byte()) // up to 510: over 255 fails
	}
	s := make([]byte, n/2)
	for i := range s {
		s[i] = 'a' + byte(i%26)
	}
	if n > 250 {
		s = append(s, bytes.Repeat([]byte{'z'}, n-n/2)...)
	}
	return string(s)
}

func (g *publishGen) table(depth int) Table {
	n := int(g.byte() % 5)
	t := make(Table, n)
	for i := 0; i < n; i++ {
		t[g.str()] = g.field(depth)
	}
	return t
}

func (g *publishGen) field(depth int) any {
	switch g.byte() % 22 {
	case 0:
		return g.byte()&1 == 1
	case 1:
		return g.byte()
	case 2:
		return int8(g.byte())
	case 3:
		return int16(g.uint16())
	case 4:
		return int(int64(g.uint64()))
	case 5:
		return int32(g.uint64())
	case 6:
		return int64(g.uint64())
	case 7:
		return g.uint16()
	case 8:
		return uint32(g.uint64())
	case 9:
		return math.Float32frombits(uint32(g.uint64()))
	case 10:
		return math.Float64frombits(g.uint64())
	case 11:
		return Decimal{Scale: g.byte(), Value: int32(g.uint64())}
	case 12:
		return g.str()
	case 13:
		return []byte(g.str())
	case 14:
		return nil
	case 15:
		return time.Unix(int64(g.uint64()>>2), 0)
	case 16:
		if depth > 0 {
			n := int(g.byte() % 4)
			a := make([]any, n)
			for i := range a {
				a[i] = g.field(depth - 1)
			}
			return a
		}
		return []any(nil)
	case 17:
		if depth > 0 {
			return g.table(depth - 1)
		}
		return Table(nil)
	case 18:
		return uint64(7) // no AMQP type: Validate refuses it
	default:
		return g.str()
	}
}

func (g *publishGen) publishing() Publishing {
	p := Publishing{
		ContentType:     g.str(),
		ContentEncoding: g.str(),
		DeliveryMode:    g.byte() % 4,
		Priority:        g.byte() % 11,
		CorrelationId:   g.str(),
		ReplyTo:         g.str(),
		Expiration:      g.str(),
		MessageId:       g.str(),
		Type:            g.str(),
		UserId:          g.str(),
		AppId:           g.str(),
	}
	if g.byte()&1 == 1 {
		p.Timestamp = time.Unix(int64(g.uint64()>>2), 0)
	}
	if g.byte()&1 == 1 {
		p.Headers = g.table(3)
	}
	n := int(g.uint16()) % 20000
	if n > 0 {
		p.Body = make([]byte, n)
		seed := g.byte()
		for i := range p.Body {
			p.Body[i] = seed + byte(i)
		}
	}
	return p
}

// FuzzPublishEncoding: for any publish, the fast path's frames are
// upstream's, byte for byte (tables compared entry by entry), or both
// refuse it for the same reason and the fast path encodes nothing.
func FuzzPublishEncoding(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 1, 1, 4, 17, 3, 16, 2, 12, 0xff, 0xff})
	f.Add(bytes.Repeat([]byte{0xff}, 64))
	f.Add(bytes.Repeat([]byte{0x11, 0x03, 0x7f}, 40))
	f.Add([]byte("A0y29809!C20809190010\xff")) // two table keys, one of 255 bytes
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &publishGen{b: data}
		channel := g.uint16()
		flags := g.byte()
		var frameSize int
		switch flags % 4 {
		case 0:
			frameSize = 0
		case 1:
			frameSize = frameMinSize + int(g.uint16())
		case 2:
			frameSize = frameHeaderSize + 1 + int(g.byte()) // many small frames
		case 3:
			frameSize = 131072
		}
		exchange, key := g.str(), g.str()
		msg := g.publishing()
		checkPublishEncoding(t, channel, exchange, key, flags&4 != 0, flags&8 != 0, msg, frameSize)
	})
}

// recordingRWC records what the client writes, fails writes on demand, and
// runs a hook once ahead of the next write (beforeNextWrite).
type recordingRWC struct {
	io.ReadWriteCloser
	mu     sync.Mutex
	record bool
	out    []byte
	fail   error
	before func()
}

func (r *recordingRWC) Write(p []byte) (int, error) {
	r.mu.Lock()
	if r.fail != nil {
		err := r.fail
		r.mu.Unlock()
		return 0, err
	}
	if r.record {
		r.out = append(r.out, p...)
	}
	before := r.before
	r.before = nil
	r.mu.Unlock()
	if before != nil {
		before()
	}
	return r.ReadWriteCloser.Write(p)
}

// beforeNextWrite makes the next write run f first, before its bytes
// reach the peer.
func (r *recordingRWC) beforeNextWrite(f func()) {
	r.mu.Lock()
	r.before = f
	r.mu.Unlock()
}

func (r *recordingRWC) set(record bool, fail error) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.out
	r.record, r.fail, r.out = record, fail, nil
	return out
}

// fastPathModes are the read paths whose publishes take the fast path.
var fastPathModes = []ReadPath{Drainer(DrainerOptions{}), Legacy(LegacyOptions{})}

// TestPublishWritesUpstreamBytes: through a connection in each mode, a
// publish writes exactly upstream's frames, and the server reads them as
// the publish that was sent.
func TestPublishWritesUpstreamBytes(t *testing.T) {
	for _, rp := range fastPathModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			rwc, srv := newSession(t)
			rec := &recordingRWC{ReadWriteCloser: rwc}
			t.Cleanup(func() { rec.Close() })
			msgs := []Publishing{
				{Body: []byte("small")},
				{ContentType: "text/plain", Headers: Table{"k": int32(1)}, Body: bytes.Repeat([]byte{'b'}, 50000)},
				{Priority: 3},
			}
			got := make(chan *basicPublish, len(msgs))
			served := make(chan struct{})
			go func() {
				defer close(served)
				srv.connectionOpen()
				srv.channelOpen(1)
				for range msgs {
					got <- srv.recv(1, &basicPublish{}).(*basicPublish)
				}
				srv.connectionClose()
			}()

			cfg := defaultConfig()
			cfg.ReadPath = rp
			c, err := Open(rec, cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			ch, err := c.Channel()
			if err != nil {
				t.Fatalf("Channel: %v", err)
			}
			for _, msg := range msgs {
				rec.set(true, nil)
				if err := ch.PublishWithContext(context.Background(), "ex", "key", false, false, msg); err != nil {
					t.Fatalf("publish: %v", err)
				}
				wrote := rec.set(false, nil)
				want, err := upstreamPublishBytes(1, "ex", "key", false, false, msg, c.Config.FrameSize)
				if err != nil {
					t.Fatalf("upstream encoding: %v", err)
				}
				comparePublishBytes(t, wrote, want)
				p := <-got
				if p.Exchange != "ex" || p.RoutingKey != "key" || !bytes.Equal(p.Body, msg.Body) ||
					p.Properties.ContentType != msg.ContentType || p.Properties.Priority != msg.Priority {
					t.Fatalf("server read %+v, want %+v", p, msg)
				}
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			<-served
		})
	}
}

// TestPublishClosedReturnsErrClosed: on a closed channel and on a closed
// connection a publish fails with ErrClosed and writes nothing, and a
// confirm-mode channel gives its delivery tag back.
func TestPublishClosedReturnsErrClosed(t *testing.T) {
	for _, rp := range fastPathModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			rwc, srv := newSession(t)
			rec := &recordingRWC{ReadWriteCloser: rwc}
			t.Cleanup(func() { rec.Close() })
			served := make(chan struct{})
			go func() {
				defer close(served)
				srv.connectionOpen()
				srv.channelOpen(1)
				srv.recv(1, &confirmSelect{})
				srv.send(1, &confirmSelectOk{})
				srv.recv(1, &channelClose{})
				srv.send(1, &channelCloseOk{})
				srv.channelOpen(2)
				srv.connectionClose()
			}()

			cfg := defaultConfig()
			cfg.ReadPath = rp
			c, err := Open(rec, cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			ch, err := c.Channel()
			if err != nil {
				t.Fatalf("Channel: %v", err)
			}
			if err := ch.Confirm(false); err != nil {
				t.Fatalf("Confirm: %v", err)
			}
			if err := ch.Close(); err != nil {
				t.Fatalf("channel Close: %v", err)
			}
			rec.set(true, nil)
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "q", false, false, Publishing{Body: []byte("x")})
			if !errors.Is(err, ErrClosed) || dc != nil {
				t.Fatalf("publish on a closed channel: %v, %v; want ErrClosed", dc, err)
			}
			if got := ch.confirms.published; got != 0 {
				t.Fatalf("delivery tags after a failed publish: %d, want 0", got)
			}

			ch2, err := c.Channel()
			if err != nil {
				t.Fatalf("Channel: %v", err)
			}
			rec.set(false, nil)
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			<-served
			rec.set(true, nil)
			if err := ch2.PublishWithContext(context.Background(), "", "q", false, false, Publishing{Body: []byte("x")}); !errors.Is(err, ErrClosed) {
				t.Fatalf("publish on a closed connection: %v; want ErrClosed", err)
			}
			if wrote := rec.set(false, nil); len(wrote) != 0 {
				t.Fatalf("failed publishes wrote %x", wrote)
			}
		})
	}
}

// openRecordedChannel opens a connection in read path rp over a recorded
// session whose server answers the handshake and one channel.open, and
// returns the connection, the channel, the recorder and the connection's
// NotifyClose chan.
func openRecordedChannel(t *testing.T, rp ReadPath) (*Connection, *Channel, *recordingRWC, chan *Error) {
	t.Helper()
	rwc, srv := newSession(t)
	rec := &recordingRWC{ReadWriteCloser: rwc}
	t.Cleanup(func() { rec.Close() })
	go func() {
		srv.connectionOpen()
		srv.channelOpen(1)
	}()

	cfg := defaultConfig()
	cfg.ReadPath = rp
	c, err := Open(rec, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	closed := c.NotifyClose(make(chan *Error, 1))
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("Channel: %v", err)
	}
	return c, ch, rec, closed
}

// TestPublishWriteErrorShutsDown: a publish whose socket write fails
// returns the error and fails the connection, as upstream's does.
func TestPublishWriteErrorShutsDown(t *testing.T) {
	for _, rp := range fastPathModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			c, ch, rec, closed := openRecordedChannel(t, rp)
			broken := errors.New("socket broken")
			rec.set(false, broken)
			err := ch.PublishWithContext(context.Background(), "", "q", false, false, Publishing{Body: []byte("x")})
			if err == nil || !strings.Contains(err.Error(), broken.Error()) {
				t.Fatalf("publish on a broken socket: %v; want %v", err, broken)
			}
			select {
			case e := <-closed:
				if e == nil || e.Code != FrameError {
					t.Fatalf("connection closed with %v, want a frame error", e)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("connection not shut down 10s after a failed publish write")
			}
			if !c.IsClosed() {
				t.Fatal("connection open after a failed publish write")
			}
		})
	}
}

// TestPublishEncodingErrorShutsDown: an exchange name over 255 bytes fails
// the publish and the connection, as upstream's does, without writing.
func TestPublishEncodingErrorShutsDown(t *testing.T) {
	for _, rp := range fastPathModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			_, ch, rec, closed := openRecordedChannel(t, rp)
			rec.set(true, nil)
			err := ch.PublishWithContext(context.Background(), strings.Repeat("e", 256), "q", false, false, Publishing{})
			if err == nil || !strings.Contains(err.Error(), "exceeds 255 bytes") {
				t.Fatalf("publish to a 256-byte exchange: %v", err)
			}
			if wrote := rec.set(false, nil); len(wrote) != 0 {
				t.Fatalf("refused publish wrote %x", wrote)
			}
			select {
			case e := <-closed:
				if e == nil || e.Code != FrameError {
					t.Fatalf("connection closed with %v, want a frame error", e)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("connection not shut down 10s after a refused publish")
			}
		})
	}
}

// gatedRWC holds every Write while its gate is shut, and can fail them.
type gatedRWC struct {
	io.ReadWriteCloser
	mu      sync.Mutex
	shut    chan struct{} // nil: open
	entered chan struct{} // a token per Write held at the gate
	fail    error
}

func (g *gatedRWC) Write(p []byte) (int, error) {
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if shut != nil {
		g.entered <- struct{}{}
		<-shut
	}
	g.mu.Lock()
	fail := g.fail
	g.mu.Unlock()
	if fail != nil {
		return 0, fail
	}
	return g.ReadWriteCloser.Write(p)
}

// TestPublishGroupCommit: publishers of one connection that arrive while
// another publisher writes go out together, in the next write (issue
// #18), each publish intact; and when that write fails, every publisher
// in it gets the error.
func TestPublishGroupCommit(t *testing.T) {
	coalescing := []ReadPath{Drainer(DrainerOptions{CoalescePublishes: true}), Legacy(LegacyOptions{CoalescePublishes: true})}
	for _, rp := range coalescing {
		for _, failing := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/failing=%v", rp.Mode(), failing), func(t *testing.T) {
				testPublishGroupCommit(t, rp, failing)
			})
		}
	}
}

func testPublishGroupCommit(t *testing.T, rp ReadPath, failing bool) {
	const channels = 6
	rwc, srv := newSession(t)
	gate := &gatedRWC{ReadWriteCloser: rwc, entered: make(chan struct{}, 1)}
	t.Cleanup(func() { gate.Close() })
	bodies := make(chan [2]int, channels) // channel, body length
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.connectionOpen()
		for i := 1; i <= channels; i++ {
			srv.channelOpen(i)
		}
		if failing {
			return
		}
		// Each publish arrives whole: method, header and body frames of
		// one channel, none interleaved with another's.
		for i := 0; i < channels; i++ {
			m, err := srv.r.ReadFrame()
			if err != nil {
				t.Errorf("server: %v", err)
				return
			}
			id := int(m.channel())
			h, _ := srv.r.ReadFrame()
			b, _ := srv.r.ReadFrame()
			bf, ok := b.(*bodyFrame)
			if _, isHeader := h.(*headerFrame); !isHeader || !ok || h.channel() != m.channel() || b.channel() != m.channel() {
				t.Errorf("server: a publish on channel %d came in pieces: %T %T", id, h, b)
				return
			}
			bodies <- [2]int{id, len(bf.Body)}
		}
		srv.connectionClose()
	}()

	cfg := defaultConfig()
	cfg.ReadPath = rp
	c, err := Open(gate, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	chans := make([]*Channel, channels)
	for i := range chans {
		if chans[i], err = c.Channel(); err != nil {
			t.Fatalf("Channel: %v", err)
		}
	}

	gate.mu.Lock()
	gate.shut = make(chan struct{})
	if failing {
		gate.fail = errors.New("socket broken")
	}
	gate.mu.Unlock()
	errs := make(chan error, channels)
	publish := func(i int) {
		errs <- chans[i].PublishWithContext(context.Background(), "", "q", false, false,
			Publishing{Body: bytes.Repeat([]byte{'x'}, i+1)})
	}
	go publish(0)
	<-gate.entered // the first holds the lock, in its write
	for i := 1; i < channels; i++ {
		go publish(i)
	}
	g := &c.rp.base().group
	joined := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.next == nil {
			return 0
		}
		return len(g.next.vecs) // one buffer a publish: its body is copied
	}
	for deadline := time.Now().Add(10 * time.Second); joined() != channels-1; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d publishers joined the next write", joined(), channels-1)
		}
		runtime.Gosched()
	}
	gate.mu.Lock()
	close(gate.shut)
	gate.shut = nil
	gate.mu.Unlock()

	for i := 0; i < channels; i++ {
		err := <-errs
		switch {
		case failing && (err == nil || !strings.Contains(err.Error(), "socket broken") && !errors.Is(err, ErrClosed)):
			t.Errorf("a publish in a failed write returned %v", err)
		case !failing && err != nil:
			t.Errorf("publish: %v", err)
		}
	}
	// The five that arrived during the first write went out in one
	// write, made by the first of them: four in another's.
	if n := c.Stats().CoalescedPublishes; n != channels-2 {
		t.Errorf("%d publishes coalesced, want %d", n, channels-2)
	}
	if failing {
		return
	}
	seen := map[int]bool{}
	for i := 0; i < channels; i++ {
		b := <-bodies
		if b[1] != b[0] || seen[b[0]] {
			t.Errorf("channel %d: body of %d bytes, or twice", b[0], b[1])
		}
		seen[b[0]] = true
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-served
}
