// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// batchModes are the read paths PublishBatch is tested in: the fast path's, upstream's, and
// the group commit's.
var batchModes = append(append([]ReadPath(nil), fastPathModes...), Upstream(), Drainer(DrainerOptions{CoalescePublishes: true}))

// cutRWC passes the next n bytes written after cut(n) on, then fails every write.
type cutRWC struct {
	*recordingRWC
	mu   sync.Mutex
	left int // bytes still passed on; -1: no cut
}

func (c *cutRWC) Write(p []byte) (int, error) {
	c.mu.Lock()
	left := c.left
	if left >= 0 {
		c.left = max(0, left-len(p))
	}
	c.mu.Unlock()
	if left < 0 || len(p) <= left {
		return c.recordingRWC.Write(p)
	}
	n := 0
	if left > 0 {
		n, _ = c.recordingRWC.Write(p[:left])
	}
	return n, errors.New("socket reset")
}

func (c *cutRWC) cut(n int) {
	c.mu.Lock()
	c.left = n
	c.mu.Unlock()
}

// batchPeer opens a connection in read path rp on a fake broker, and its channel 1, in
// confirm mode if asked. The broker then reads publishes, handing each on over got,
// until the connection ends; served is closed once it has.
func batchPeer(t *testing.T, rp ReadPath, confirm bool) (c *Connection, ch *Channel, rwc *cutRWC, got <-chan *basicPublish, served <-chan struct{}) {
	t.Helper()
	pipe, srv := newSession(t)
	rwc = &cutRWC{recordingRWC: &recordingRWC{ReadWriteCloser: pipe}, left: -1}
	t.Cleanup(func() { rwc.Close() })
	pubs, done := make(chan *basicPublish, 64), make(chan struct{})
	go func() {
		defer close(done)
		srv.connectionOpen()
		srv.channelOpen(1)
		if confirm {
			srv.recv(1, &confirmSelect{})
			srv.send(1, &confirmSelectOk{})
		}
		var p *basicPublish
		remaining := 0
		for {
			f, err := srv.r.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *methodFrame:
				if _, ok := f.Method.(*connectionClose); ok {
					srv.send(0, &connectionCloseOk{})
					return
				}
				p, _ = f.Method.(*basicPublish)
				continue
			case *headerFrame:
				p.Properties, remaining = f.Properties, int(f.Size)
			case *bodyFrame:
				p.Body = append(p.Body, f.Body...)
				remaining -= len(f.Body)
			default:
				continue
			}
			if remaining == 0 {
				pubs <- p
			}
		}
	}()
	cfg := defaultConfig()
	cfg.ReadPath = rp
	c, err := Open(rwc, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if ch, err = c.Channel(); err != nil {
		t.Fatalf("Channel: %v", err)
	}
	if confirm {
		if err := ch.Confirm(false); err != nil {
			t.Fatalf("Confirm: %v", err)
		}
	}
	return c, ch, rwc, pubs, done
}

// batchMessages are publishes with a table, a body frame of its own, none, and three frames.
func batchMessages() []BatchPublishing {
	return []BatchPublishing{
		{Key: "a", Msg: Publishing{Body: []byte("small")}},
		{Exchange: "ex", Key: "b", Mandatory: true, Msg: Publishing{ContentType: "text/plain", Headers: Table{"k": int32(1), "s": "v"}, Body: bytes.Repeat([]byte{'b'}, 3000)}},
		{Key: "c", Msg: Publishing{Priority: 3}},
		{Key: "d", Msg: Publishing{MessageId: "m", Body: bytes.Repeat([]byte{'d'}, 50000)}},
		{Key: "e", Msg: Publishing{Body: []byte("last")}},
	}
}

// TestPublishBatchWritesOneByOneBytes: in every mode a batch writes the frames that its
// messages published one by one write, in the same order, and with a read path in one write.
func TestPublishBatchWritesOneByOneBytes(t *testing.T) {
	for _, rp := range batchModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			c, ch, rwc, got, served := batchPeer(t, rp, false)
			batch := batchMessages()
			var oneByOne []byte
			for _, p := range batch {
				rwc.set(true, nil)
				if err := ch.PublishWithContext(context.Background(), p.Exchange, p.Key, p.Mandatory, p.Immediate, p.Msg); err != nil {
					t.Fatalf("publish: %v", err)
				}
				oneByOne = append(oneByOne, rwc.set(false, nil)...)
				<-got
			}
			writes := c.Stats().Writes
			rwc.set(true, nil)
			dcs, err := ch.PublishBatch(context.Background(), batch)
			if err != nil || dcs != nil {
				t.Fatalf("PublishBatch: %v, %v; want no confirmations, no error", dcs, err)
			}
			comparePublishBytes(t, rwc.set(false, nil), oneByOne)
			// One write (a heartbeat could make it two): a write a message would be five.
			if n := c.Stats().Writes - writes; rp.Mode() != "upstream" && (n < 1 || n > 2) {
				t.Errorf("the batch took %d writes, want 1", n)
			}
			for i, want := range batch {
				p := <-got
				if p.Exchange != want.Exchange || p.RoutingKey != want.Key || p.Mandatory != want.Mandatory ||
					!bytes.Equal(p.Body, want.Msg.Body) || p.Properties.Priority != want.Msg.Priority {
					t.Fatalf("message %d: the peer read %+v, want %+v", i, p, want)
				}
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			<-served
		})
	}
}

// TestPublishBatchRefusesBeforeWriting: a cancelled ctx, an empty batch and a batch with
// a message that cannot be encoded write nothing, the last with an error naming the
// message; the connection and channel stay usable, and no delivery tag is taken.
func TestPublishBatchRefusesBeforeWriting(t *testing.T) {
	for _, rp := range batchModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			c, ch, rwc, got, served := batchPeer(t, rp, true)
			rwc.set(true, nil)
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			if dcs, err := ch.PublishBatch(cancelled, batchMessages()); !errors.Is(err, context.Canceled) || dcs != nil {
				t.Errorf("PublishBatch with a cancelled ctx: %v, %v; want context.Canceled", dcs, err)
			}
			if dcs, err := ch.PublishBatch(context.Background(), nil); err != nil || dcs != nil {
				t.Errorf("PublishBatch(nil): %v, %v; want nil, nil", dcs, err)
			}
			for bad, want := range map[int]string{1: "not supported", 3: "exceeds 255 bytes"} {
				batch := batchMessages()
				batch[1].Msg.Headers["bad"] = struct{}{}
				if bad == 3 {
					batch[1].Msg.Headers = nil
					batch[3].Key = strings.Repeat("k", 256)
				}
				dcs, err := ch.PublishBatch(context.Background(), batch)
				if err == nil || dcs != nil || !strings.Contains(err.Error(), fmt.Sprintf("message %d of 5", bad)) || !strings.Contains(err.Error(), want) {
					t.Errorf("a batch with message %d bad: %v, %v; want an error naming it, and %q", bad, dcs, err, want)
				}
			}
			if wrote := rwc.set(false, nil); len(wrote) != 0 {
				t.Fatalf("refused batches wrote %x", wrote)
			}
			if n := ch.confirms.published; n != 0 {
				t.Fatalf("refused batches took %d delivery tags", n)
			}
			dcs, err := ch.PublishBatch(context.Background(), batchMessages()[:2])
			if err != nil || len(dcs) != 2 || dcs[0].DeliveryTag != 1 || dcs[1].DeliveryTag != 2 {
				t.Fatalf("PublishBatch after the refusals: %v, %v; want tags 1 and 2", dcs, err)
			}
			if p1, p2 := <-got, <-got; p1.RoutingKey != "a" || p2.RoutingKey != "b" {
				t.Fatalf("the peer read %q then %q, want a then b", p1.RoutingKey, p2.RoutingKey)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			<-served
		})
	}
}

// TestPublishBatchWriteFails: a socket that fails partway through a batch's write fails the
// connection; PublishBatch returns the write's error and, since part of the batch went out,
// every confirmation, each resolved (nacked) by the connection's end; then ErrClosed.
func TestPublishBatchWriteFails(t *testing.T) {
	for _, rp := range batchModes {
		t.Run(rp.Mode(), func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			c, ch, rwc, _, served := batchPeer(t, rp, true)
			closed := c.NotifyClose(make(chan *Error, 1))
			batch := batchMessages()
			rwc.cut(1000) // past the first message, inside the second's body
			dcs, err := ch.PublishBatch(context.Background(), batch)
			if err == nil || !strings.Contains(err.Error(), "socket reset") || len(dcs) != len(batch) {
				t.Fatalf("PublishBatch on a failing socket: %d confirmations, %v; want %d and the write's error", len(dcs), err, len(batch))
			}
			for i, dc := range dcs {
				select {
				case <-dc.Done():
					if dc.Acked() {
						t.Errorf("message %d acked, with no ack sent", i)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("message %d's confirmation unresolved 10s after the connection failed", i)
				}
			}
			select {
			case e := <-closed:
				if e == nil || e.Code != FrameError {
					t.Fatalf("connection closed with %v, want a frame error", e)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("connection not shut down 10s after a failed batch write")
			}
			if _, err := ch.PublishBatch(context.Background(), batch); !errors.Is(err, ErrClosed) {
				t.Fatalf("PublishBatch on the failed connection: %v; want ErrClosed", err)
			}
			rwc.Close()
			<-served
		})
	}
}

// TestPublishBatchObserved: an Observer sees each message of a batch as a publish of its own:
// BeforePublish may change it, and Published gets its delivery tag and BeforePublish's ctx.
func TestPublishBatchObserved(t *testing.T) {
	type key struct{}
	var published []PublishInfo
	obs := &Observer{
		BeforePublish: func(ctx context.Context, info PublishInfo, msg *Publishing) context.Context {
			msg.AppId = info.RoutingKey
			return context.WithValue(ctx, key{}, info.RoutingKey)
		},
		Published: func(ctx context.Context, info PublishInfo, err error) {
			if err != nil || ctx.Value(key{}) != info.RoutingKey {
				t.Errorf("Published(%v, %+v, %v)", ctx.Value(key{}), info, err)
			}
			published = append(published, info)
		},
	}
	c, ch, _, got, served := batchPeer(t, Drainer(DrainerOptions{Observer: obs}), true)
	batch := batchMessages()
	if _, err := ch.PublishBatch(context.Background(), batch); err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
	for i, want := range batch {
		if p := <-got; p.Properties.AppId != want.Key || want.Msg.AppId != "" {
			t.Errorf("message %d: AppId %q, want %q set on the copy only", i, p.Properties.AppId, want.Key)
		}
		if info := published[i]; info.DeliveryTag != uint64(i+1) || info.BodySize != len(want.Msg.Body) {
			t.Errorf("message %d: Published got %+v", i, info)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-served
}
