// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"net"
	"testing"
)

// tallyStream is what a client writes at the start of a connection and
// after: the protocol header, then frames encoded by upstream's writer.
// It returns the stream, its frame count and the settlements in it.
func tallyStream(t testing.TB, extra []byte) ([]byte, uint64, []SettleInfo) {
	var buf bytes.Buffer
	buf.Write(amqpHeader[:])
	w := &writer{&buf}
	frames := []frame{
		&methodFrame{ChannelId: 0, Method: &connectionStartOk{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"}},
		&methodFrame{ChannelId: 1, Method: &basicAck{DeliveryTag: 7, Multiple: true}},
		&heartbeatFrame{},
		&methodFrame{ChannelId: 2, Method: &basicNack{DeliveryTag: 1 << 40, Requeue: true}},
		&methodFrame{ChannelId: 3, Method: &basicPublish{Exchange: "x", RoutingKey: "k"}},
		&headerFrame{ChannelId: 3, ClassId: 60, Size: 5},
		&bodyFrame{ChannelId: 3, Body: []byte("hello")},
		&methodFrame{ChannelId: 1, Method: &basicReject{DeliveryTag: 9, Requeue: false}},
	}
	for _, f := range frames {
		if err := w.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	buf.Write(extra)
	want := []SettleInfo{
		{Kind: SettleAck, Channel: 1, DeliveryTag: 7, Multiple: true},
		{Kind: SettleNack, Channel: 2, DeliveryTag: 1 << 40, Requeue: true},
		{Kind: SettleReject, Channel: 1, DeliveryTag: 9},
	}
	return buf.Bytes(), uint64(len(frames)), want
}

// TestFrameTally: frames are counted and settlements read off the stream
// whatever the write sizes, one byte at a time included, and through
// writingVectors as through wrote.
func TestFrameTally(t *testing.T) {
	stream, frames, want := tallyStream(t, nil)
	for _, chunk := range []int{1, 2, 3, 7, 8, 13, 64, len(stream)} {
		var got []SettleInfo
		c := &ioCounters{settled: func(s SettleInfo) { got = append(got, s) }}
		for p := stream; len(p) > 0; {
			n := min(chunk, len(p))
			if chunk%2 == 0 {
				c.wrote(p[:n])
			} else {
				c.writingVectors(net.Buffers{p[:n/2], p[n/2 : n]})
				c.bytesOut.Add(uint64(n))
			}
			p = p[n:]
		}
		if f := c.framesOut.Load(); f != frames {
			t.Errorf("chunks of %d: %d frames, want %d", chunk, f, frames)
		}
		if b := c.bytesOut.Load(); b != uint64(len(stream)) {
			t.Errorf("chunks of %d: %d bytes, want %d", chunk, b, len(stream))
		}
		if len(got) != len(want) {
			t.Fatalf("chunks of %d: settlements %+v, want %+v", chunk, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("chunks of %d: settlement %d is %+v, want %+v", chunk, i, got[i], want[i])
			}
		}
	}
}

// FuzzFrameTally: any bytes after a valid stream, cut anywhere, never
// panic, and the valid part is always counted the same.
func FuzzFrameTally(f *testing.F) {
	f.Add([]byte{}, uint8(1))
	f.Add([]byte{1, 0, 1, 0, 0, 0, 13, 0, 60, 0, 80}, uint8(5))
	f.Add([]byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1, 8, 0, 0, 0, 0, 0, 0, 0xce}, uint8(3))
	f.Fuzz(func(t *testing.T, extra []byte, chunk uint8) {
		stream, frames, want := tallyStream(t, extra)
		size := int(chunk%32) + 1
		var got []SettleInfo
		c := &ioCounters{settled: func(s SettleInfo) { got = append(got, s) }}
		for p := stream; len(p) > 0; {
			n := min(size, len(p))
			c.wrote(p[:n])
			p = p[n:]
		}
		if c.framesOut.Load() < frames {
			t.Fatalf("%d frames, want at least %d", c.framesOut.Load(), frames)
		}
		if len(got) < len(want) {
			t.Fatalf("settlements %+v, want at least %+v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("settlement %d is %+v, want %+v", i, got[i], want[i])
			}
		}
	})
}
