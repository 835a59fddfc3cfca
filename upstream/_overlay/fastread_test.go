// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

// encodeFrame encodes f with upstream's writer.
func encodeFrame(t testing.TB, f frame) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := f.write(&buf); err != nil {
		t.Fatalf("encoding %T: %v", f, err)
	}
	return buf.Bytes()
}

// fullProperties sets every property, headers included.
var fullProperties = properties{
	ContentType: "application/json", ContentEncoding: "utf-8",
	Headers:      Table{"a": int32(1), "b": "two", "c": Table{"d": []interface{}{"e", int64(5)}}, "f": 1.5},
	DeliveryMode: 2, Priority: 9, CorrelationId: "corr", ReplyTo: "reply", Expiration: "60000",
	MessageId: "mid", Timestamp: time.Unix(1700000000, 0), Type: "type", UserId: "guest",
	AppId: "app", reserved1: "cluster",
}

// sameValue compares two decoded values; %#v as a second chance treats
// NaNs in a table as equal, which reflect.DeepEqual does not.
func sameValue(a, b interface{}) bool {
	return reflect.DeepEqual(a, b) || fmt.Sprintf("%#v", a) == fmt.Sprintf("%#v", b)
}

// fastHeaderFrame returns what the fast path decoded, as upstream's type.
func fastHeaderFrame(raw []byte, rh *rawHeader) *headerFrame {
	var a contentAsm
	return &headerFrame{
		ChannelId:  binary.BigEndian.Uint16(raw[1:3]),
		ClassId:    rh.classId,
		weight:     rh.weight,
		Size:       rh.size,
		Properties: a.headerProps(rh),
	}
}

// checkFastDecode asserts that the fast path and upstream's reader agree
// on raw, a frame as the splitter returns it: where the fast path decodes,
// upstream's reader parses the same values; where it declines a frame it
// claims (content headers, basic.deliver), upstream's reader fails.
func checkFastDecode(t *testing.T, raw []byte) {
	var max atomic.Uint32
	split := newFrameSplitter(&max)
	want, wantErr := split.parse(raw)

	switch raw[0] {
	case frameHeader:
		var hd headerDecoder
		var rh rawHeader
		if !hd.decode(raw, &rh) {
			if wantErr == nil {
				t.Fatalf("fast path declined a header upstream parses: %#v", want)
			}
			return
		}
		if wantErr != nil {
			t.Fatalf("fast path decoded a header upstream refuses (%v)", wantErr)
		}
		if got := fastHeaderFrame(raw, &rh); !sameValue(got, want) {
			t.Fatalf("header:\nfast     %#v\nupstream %#v", got, want)
		}
	case frameMethod:
		var rd rawDeliver
		isDeliver := len(raw) >= 11 && binary.BigEndian.Uint16(raw[7:9]) == 60 && binary.BigEndian.Uint16(raw[9:11]) == 60
		if !decodeDeliver(raw, &rd) {
			if isDeliver && wantErr == nil {
				t.Fatalf("fast path declined a basic.deliver upstream parses: %#v", want)
			}
			return
		}
		if !isDeliver {
			t.Fatalf("fast path decoded a method that is not basic.deliver")
		}
		if wantErr != nil {
			t.Fatalf("fast path decoded a basic.deliver upstream refuses (%v)", wantErr)
		}
		var a contentAsm
		a.startDeliver(&rd)
		got := &methodFrame{ChannelId: binary.BigEndian.Uint16(raw[1:3]), ClassId: 60, MethodId: 60,
			Method: &basicDeliver{
				ConsumerTag: a.deliver.consumerTag, DeliveryTag: a.deliver.deliveryTag,
				Redelivered: a.deliver.redelivered, Exchange: a.deliver.exchange, RoutingKey: a.deliver.routingKey,
			}}
		if !sameValue(got, want) {
			t.Fatalf("basic.deliver:\nfast     %#v\nupstream %#v", got.Method, want.(*methodFrame).Method)
		}
	case frameBody:
		var cr contentReader
		cf, err := cr.decode(split, raw)
		if err != nil || wantErr != nil {
			t.Fatalf("body frame: fast %v, upstream %v", err, wantErr)
		}
		if !bytes.Equal(cf.body, want.(*bodyFrame).Body) {
			t.Fatalf("body: fast %q, upstream %q", cf.body, want.(*bodyFrame).Body)
		}
	}
}

func TestFastDecodeAgreesWithUpstream(t *testing.T) {
	for _, raw := range fastDecodeSeeds(t) {
		checkFastDecode(t, raw)
	}
}

// fastDecodeSeeds are well-formed frames of every kind the fast path
// claims, and damaged copies of them.
func fastDecodeSeeds(t testing.TB) [][]byte {
	deliver := &methodFrame{ChannelId: 3, Method: &basicDeliver{
		ConsumerTag: "ctag", DeliveryTag: 1 << 40, Redelivered: true, Exchange: "ex", RoutingKey: "rk"}}
	seeds := [][]byte{
		encodeFrame(t, deliver),
		encodeFrame(t, &methodFrame{ChannelId: 1, Method: &basicDeliver{}}),
		encodeFrame(t, &methodFrame{ChannelId: 1, Method: &basicAck{DeliveryTag: 5}}),
		encodeFrame(t, &headerFrame{ChannelId: 3, ClassId: 60, Size: 10, Properties: fullProperties}),
		encodeFrame(t, &headerFrame{ChannelId: 3, ClassId: 60, Size: 0}),
		encodeFrame(t, &headerFrame{ChannelId: 3, ClassId: 60, Size: 1 << 62,
			Properties: properties{ContentType: "text/plain", Headers: Table{}}}),
		encodeFrame(t, &bodyFrame{ChannelId: 3, Body: []byte("hello")}),
	}
	var damaged [][]byte
	for _, s := range seeds {
		// One byte short of every field, padded to keep the frame's shape.
		for cut := 8; cut < len(s)-1; cut += 3 {
			d := rawFrame(s[0], 3, s[7:cut])
			damaged = append(damaged, d)
		}
		// Trailing bytes after the arguments, then the frame-end.
		damaged = append(damaged, rawFrame(s[0], 3, append(append([]byte{}, s[7:len(s)-1]...), frameEnd, 1, 2)))
		damaged = append(damaged, rawFrame(s[0], 3, append(append([]byte{}, s[7:len(s)-1]...), 0, 0)))
	}
	return append(seeds, damaged...)
}

// FuzzFastDecode: on any payload, as a method, header or body frame, the
// fast path agrees with upstream's reader (checkFastDecode).
func FuzzFastDecode(f *testing.F) {
	for _, raw := range fastDecodeSeeds(f) {
		f.Add(raw[0], raw[7:len(raw)-1])
	}
	f.Fuzz(func(t *testing.T, typ byte, payload []byte) {
		switch typ % 3 {
		case 0:
			typ = frameMethod
		case 1:
			typ = frameHeader
		default:
			typ = frameBody
		}
		checkFastDecode(t, rawFrame(typ, 1, payload))
	})
}

// assemblyScript turns fuzz bytes into frames on channels 1 and 2: each
// op byte picks a channel and one of basic.deliver, a content header
// (sizes from 0 to a forged 2^62), a body frame, or basic.ack, which
// interrupts content in progress.
func assemblyScript(t testing.TB, ops []byte) [][]byte {
	var frames [][]byte
	for i, op := range ops {
		ch := uint16(1 + op&1)
		arg := int(op>>4) + i
		switch op >> 1 & 7 {
		case 0, 1:
			frames = append(frames, encodeFrame(t, &methodFrame{ChannelId: ch, Method: &basicDeliver{
				ConsumerTag: fmt.Sprint("tag", arg%2), DeliveryTag: uint64(i), Exchange: "ex",
				RoutingKey: fmt.Sprint("rk", arg%3)}}))
		case 2:
			sizes := []uint64{0, 1, 5, 16, 4096, 1 << 62}
			props := properties{ContentType: fmt.Sprint("ct", arg%2)}
			if arg%5 == 0 {
				props = fullProperties
			}
			frames = append(frames, encodeFrame(t, &headerFrame{ChannelId: ch, ClassId: 60,
				Size: sizes[arg%len(sizes)], Properties: props}))
		case 3, 4, 5:
			n := []int{0, 1, 3, 5, 16, 4096}[arg%6]
			frames = append(frames, encodeFrame(t, &bodyFrame{ChannelId: ch, Body: bytes.Repeat([]byte{byte(i)}, n)}))
		default:
			frames = append(frames, encodeFrame(t, &methodFrame{ChannelId: ch, Method: &basicAck{DeliveryTag: 1}}))
		}
	}
	return frames
}

// checkAssembly feeds frames to upstream's channel state machine (parsed
// by upstream's reader) and to the fast path, and asserts both deliver the
// same messages, in the same order, with the same bodies.
func checkAssembly(t *testing.T, frames [][]byte, maxFrame uint32) {
	// Upstream sizes a body from Config.FrameSize, which dialling always
	// sets.
	c := &Connection{Config: Config{FrameSize: int(maxFrame)}}
	var max atomic.Uint32
	max.Store(maxFrame)
	split := newFrameSplitter(&max)

	type side struct {
		chans map[uint16]*Channel
		out   chan *Delivery
	}
	newSide := func() side {
		s := side{chans: map[uint16]*Channel{}, out: make(chan *Delivery, len(frames))}
		for _, id := range []uint16{1, 2} {
			ch := newChannel(c, id)
			// The consumers' input, without their buffer goroutines:
			// consumers.send hands each delivery straight to out.
			ch.consumers.chans["tag0"] = s.out
			ch.consumers.chans["tag1"] = s.out
			s.chans[id] = ch
		}
		return s
	}
	up, fast := newSide(), newSide()
	cr := &contentReader{asms: map[uint16]*contentAsm{}, budget: newBudget(1<<40, 1<<39)}

	for _, raw := range frames {
		id := binary.BigEndian.Uint16(raw[1:3])
		f, err := split.parse(raw)
		if err != nil {
			t.Fatalf("upstream cannot parse %x: %v", raw, err)
		}
		ch := up.chans[id]
		ch.recv(ch, f)

		cf, err := cr.decode(split, raw)
		if err != nil {
			t.Fatalf("fast path cannot decode %x: %v", raw, err)
		}
		ch = fast.chans[id]
		a := cr.asm(id, ch)
		complete, method := cr.feed(a, &cf, maxFrame)
		switch {
		case method != nil:
			ch.recv(ch, method)
		case complete:
			if del, msg := a.complete(); del != nil {
				ch.consumers.send(del.ConsumerTag, del)
			} else {
				ch.dispatch(msg)
			}
		}
	}
	cr.release()
	if used := cr.budget.used; used != 0 {
		t.Errorf("budget: %d bytes still charged after release", used)
	}
	close(up.out)
	close(fast.out)
	for want := range up.out {
		got, ok := <-fast.out
		if !ok {
			t.Fatalf("fast path delivered less; missing %d", want.DeliveryTag)
		}
		// Both channels of a side are distinct objects: compare the id.
		if got.Acknowledger.(*Channel).id != want.Acknowledger.(*Channel).id {
			t.Fatalf("delivery %d on channel %d, want %d", got.DeliveryTag,
				got.Acknowledger.(*Channel).id, want.Acknowledger.(*Channel).id)
		}
		got.Acknowledger, want.Acknowledger = nil, nil
		if !sameValue(got, want) {
			t.Fatalf("delivery:\nfast     %#v\nupstream %#v", got, want)
		}
	}
	if got, ok := <-fast.out; ok {
		t.Fatalf("fast path delivered more: %d", got.DeliveryTag)
	}
}

func TestFastAssemblyEdgeCases(t *testing.T) {
	enc := func(f frame) []byte { return encodeFrame(t, f) }
	deliver := func(ch uint16, tag uint64) []byte {
		return enc(&methodFrame{ChannelId: ch, Method: &basicDeliver{ConsumerTag: "tag0", DeliveryTag: tag}})
	}
	header := func(ch uint16, size uint64) []byte {
		return enc(&headerFrame{ChannelId: ch, ClassId: 60, Size: size, Properties: fullProperties})
	}
	body := func(ch uint16, n int) []byte {
		return enc(&bodyFrame{ChannelId: ch, Body: bytes.Repeat([]byte{byte(n)}, n)})
	}
	ack := func(ch uint16) []byte { return enc(&methodFrame{ChannelId: ch, Method: &basicAck{}}) }
	const frameMax = 4096
	chunk := frameMax - frameHeaderSize

	for name, frames := range map[string][][]byte{
		"zero body":                 {deliver(1, 1), header(1, 0)},
		"one frame":                 {deliver(1, 1), header(1, 3), body(1, 3)},
		"exact frame-max chunks":    {deliver(1, 1), header(1, uint64(2*chunk)), body(1, chunk), body(1, chunk)},
		"overshooting last frame":   {deliver(1, 1), header(1, 4), body(1, 3), body(1, 3)},
		"interleaved channels":      {deliver(1, 1), deliver(2, 2), header(2, 2), header(1, 4), body(1, 2), body(2, 2), body(1, 2)},
		"method interrupts content": {deliver(1, 1), header(1, 4), body(1, 2), ack(1), body(1, 2), deliver(1, 2), header(1, 1), body(1, 1)},
		"header without method":     {header(1, 1), body(1, 1), deliver(1, 2), header(1, 1), body(1, 1)},
		"body without header":       {deliver(1, 1), body(1, 1), header(1, 1), body(1, 1)},
		"second header":             {deliver(1, 1), header(1, 3), header(1, 3), body(1, 3)},
		"forged huge size":          {deliver(1, 1), header(1, 1<<62), body(1, chunk), body(1, chunk), body(1, chunk), ack(1)},
	} {
		t.Run(name, func(t *testing.T) { checkAssembly(t, frames, frameMax) })
	}
}

// TestFastAssemblyForgedSizeAllocatesNothingByItself: a header announcing
// 2^62 bytes costs no more than one frame's worth until bytes arrive.
func TestFastAssemblyForgedSizeAllocatesNothingByItself(t *testing.T) {
	var a contentAsm
	a.startDeliver(&rawDeliver{})
	if a.header(1<<62, properties{}, 4096) {
		t.Fatal("complete at the header")
	}
	if cap(a.body) > 4096 {
		t.Fatalf("body capacity %d after a forged header, want at most one frame", cap(a.body))
	}
	a.bodyFrame(make([]byte, 4088))
	a.bodyFrame(make([]byte, 4088))
	if cap(a.body) > 4*4096 {
		t.Fatalf("body capacity %d after two frames", cap(a.body))
	}
}

// FuzzContentAssembly: any interleaving of deliveries, headers, bodies and
// interrupting methods on two channels is assembled by the fast path as
// by upstream's state machine.
func FuzzContentAssembly(f *testing.F) {
	f.Add([]byte{0, 4, 6, 1, 5, 7, 8, 12})
	f.Add([]byte{0, 4, 6, 14, 6, 0, 4, 6, 6, 6})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		checkAssembly(t, assemblyScript(t, ops), 4096+frameHeaderSize)
	})
}
