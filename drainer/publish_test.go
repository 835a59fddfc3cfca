package drainer_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/legacyread"
)

// publishBody is publisher pub's message seq: its ids, then a pattern that
// depends on both, of a length that varies from empty to several frames.
func publishBody(pub, seq uint32) []byte {
	n := int(pub*7919+seq*104729) % 13000
	if n < 8 {
		n = 8
	}
	b := make([]byte, n)
	binary.BigEndian.PutUint32(b, pub)
	binary.BigEndian.PutUint32(b[4:], seq)
	for i := 8; i < n; i++ {
		b[i] = byte(uint32(i) + pub + seq)
	}
	return b
}

// contentReader reassembles the publishes the peer reads, per channel, and
// checks that no frame of one publish lands inside another's on its channel.
type contentReader struct {
	mu      sync.Mutex
	pending map[uint16]*pendingContent
	got     map[uint32][]uint32 // publisher → sequence numbers, in arrival order
}

type pendingContent struct {
	key       string
	sawHeader bool
	size      uint64
	body      []byte
}

func (r *contentReader) frame(f fakepeer.Frame) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pending[f.Channel]
	switch f.Type {
	case fakepeer.FrameMethod:
		if p != nil {
			return fmt.Errorf("method frame on channel %d inside a publish's content", f.Channel)
		}
		if c, m := f.Method(); c != 60 || m != 40 {
			return nil
		}
		a := fakepeer.ReadArgs(f.Args())
		a.Short()
		a.ShortStr()
		key := a.ShortStr()
		if err := a.Err(); err != nil {
			return err
		}
		r.pending[f.Channel] = &pendingContent{key: key}
		return nil
	case fakepeer.FrameHeader:
		if p == nil || p.sawHeader {
			return fmt.Errorf("unexpected content header on channel %d", f.Channel)
		}
		p.sawHeader, p.size = true, binary.BigEndian.Uint64(f.Payload[4:12])
	case fakepeer.FrameBody:
		if p == nil || !p.sawHeader {
			return fmt.Errorf("unexpected body frame on channel %d", f.Channel)
		}
		p.body = append(p.body, f.Payload...)
		if uint64(len(p.body)) > p.size {
			return fmt.Errorf("body on channel %d longer than its header's %d", f.Channel, p.size)
		}
	default:
		return nil
	}
	if uint64(len(p.body)) < p.size {
		return nil
	}
	delete(r.pending, f.Channel)
	pub, seq := binary.BigEndian.Uint32(p.body), binary.BigEndian.Uint32(p.body[4:])
	if want := publishBody(pub, seq); string(p.body) != string(want) || p.key != fmt.Sprint("p", pub) {
		return fmt.Errorf("publish %d/%d arrived altered (routing key %q, %d bytes)", pub, seq, p.key, len(p.body))
	}
	r.got[pub] = append(r.got[pub], seq)
	return nil
}

// TestConcurrentPublishesStayWhole: publishers sharing one channel, and
// publishers on several channels, through the publish fast path of the
// drainer and legacy modes over TCP (vectored writes, 4096-octet frames):
// every publish arrives whole, with its frames in sequence, and each
// publisher's in order.
func TestConcurrentPublishesStayWhole(t *testing.T) {
	modes := map[string]amqp.ReadPath{
		"drainer": drainer.ReadPath(drainer.Options{}),
		"legacy":  legacyread.ReadPath(legacyread.Options{}),
		// The group commit: publishes of several channels share writes.
		"drainer-coalesce": drainer.ReadPath(drainer.Options{CoalescePublishes: true}),
		"legacy-coalesce":  legacyread.ReadPath(legacyread.Options{CoalescePublishes: true}),
	}
	for name, rp := range modes {
		for _, shape := range []struct{ channels, perChannel int }{{1, 8}, {4, 2}, {8, 1}} {
			t.Run(fmt.Sprintf("%s/channels=%d/publishers=%d", name, shape.channels, shape.perChannel), func(t *testing.T) {
				testConcurrentPublishes(t, rp, shape.channels, shape.perChannel)
			})
		}
	}
}

func testConcurrentPublishes(t *testing.T, rp amqp.ReadPath, channels, perChannel int) {
	const perPublisher = 150
	r := &contentReader{pending: map[uint16]*pendingContent{}, got: map[uint32][]uint32{}}
	peer := fakepeer.Listen(t, fakepeer.WithFrameMax(4096))
	peer.Serve(func(s *fakepeer.Session) error {
		for {
			f, err := s.ReadFrame()
			if err != nil {
				return err
			}
			c, m := f.Method()
			switch {
			case f.Type == fakepeer.FrameMethod && c == 20 && m == 10:
				err = s.Send(fakepeer.ChannelOpenOk(f.Channel))
			case f.Type == fakepeer.FrameMethod && c == 20 && m == 40:
				err = s.Send(fakepeer.ChannelCloseOk(f.Channel))
			case f.Type == fakepeer.FrameMethod && c == 10 && m == 50:
				return s.Send(fakepeer.ConnectionCloseOk())
			default:
				err = r.frame(f)
			}
			if err != nil {
				return err
			}
		}
	})

	cfg := amqp.Config{ReadPath: rp}
	conn, err := amqp.DialConfig(peer.URL()+"?heartbeat=0", cfg)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	var wg sync.WaitGroup
	errs := make(chan error, channels*perChannel)
	for c := 0; c < channels; c++ {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("channel: %v", err)
		}
		for p := 0; p < perChannel; p++ {
			pub := uint32(c*perChannel + p)
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprint("p", pub)
				for seq := uint32(0); seq < perPublisher; seq++ {
					msg := amqp.Publishing{ContentType: "application/octet-stream", Body: publishBody(pub, seq)}
					if err := ch.PublishWithContext(context.Background(), "", key, false, false, msg); err != nil {
						errs <- fmt.Errorf("publisher %d, publish %d: %w", pub, seq, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := conn.Stats()
	t.Logf("%d publishes in %d writes, %d of them in another publisher's write", channels*perChannel*perPublisher, s.Writes, s.CoalescedPublishes)
	// Close is answered after every publish before it was read.
	if err := conn.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pending) != 0 {
		t.Fatalf("publishes left incomplete on channels %v", r.pending)
	}
	for pub := uint32(0); pub < uint32(channels*perChannel); pub++ {
		seqs := r.got[pub]
		if len(seqs) != perPublisher {
			t.Fatalf("publisher %d: %d publishes arrived, want %d", pub, len(seqs), perPublisher)
		}
		for i, seq := range seqs {
			if seq != uint32(i) {
				t.Fatalf("publisher %d: publish %d arrived in place %d", pub, seq, i)
			}
		}
	}
}
