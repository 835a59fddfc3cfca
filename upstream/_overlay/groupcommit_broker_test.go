// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

//go:build integration

package amqp091

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ackBroker dials the broker in read path rp, with a fresh queue, and consumers channels
// with prefetch to consume it; end deletes the queue and closes the connection.
func ackBroker(tb testing.TB, rp ReadPath, queue string, consumers int) (conn *Connection, cchs []*Channel, end func()) {
	tb.Helper()
	cfg := defaultConfig()
	cfg.ReadPath = rp
	conn, err := DialConfig(amqpURL, cfg)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(queue, false, false, false, false, nil)
	}
	if err == nil {
		_, err = ch.QueuePurge(queue, false)
	}
	for i := 0; i < consumers && err == nil; i++ {
		var cch *Channel
		if cch, err = conn.Channel(); err == nil {
			err = cch.Qos(500, 0, false)
		}
		cchs = append(cchs, cch)
	}
	if err != nil {
		conn.Close()
		tb.Fatalf("queue or consumer channels: %v", err)
	}
	return conn, cchs, func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		conn.Close()
	}
}

// consumeAcking runs a ConsumeFunc on each of cchs that acks every delivery, until total have
// been acked between them (nil) or one failed (its error). Each body goes to seen first.
func consumeAcking(ctx context.Context, cchs []*Channel, queue string, total int, seen func(body string) error) <-chan error {
	ctx, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	acked, errs, done := 0, make(chan error, len(cchs)), make(chan error, 1)
	handle := func(d *Delivery) error {
		mu.Lock()
		err := seen(string(d.Body))
		mu.Unlock()
		if err == nil {
			err = d.Ack(false)
		}
		mu.Lock()
		if acked++; acked == total || err != nil {
			stop()
		}
		mu.Unlock()
		return err
	}
	for _, ch := range cchs {
		go func(ch *Channel) { errs <- ch.ConsumeFunc(ctx, queue, ConsumeFuncOptions{}, handle) }(ch)
	}
	go func() {
		defer stop()
		var first error
		for range cchs {
			if err := <-errs; err != nil && err != context.Canceled && first == nil {
				first = err
				stop()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if first == nil && acked != total {
			first = fmt.Errorf("%d of %d acked: %w", acked, total, ctx.Err())
		}
		done <- first
	}()
	return done
}

// TestAckGroupCommitBroker: with coalescing, in drainer and legacy-autodrain modes, a
// ConsumeFunc acks every message while four publishers on other channels of the same
// connection publish 5,000 in confirm mode: every one is confirmed, delivered once and acked,
// and once the consumer's channel is closed (which would requeue anything unacked) the
// queue is empty.
func TestAckGroupCommitBroker(t *testing.T) {
	for _, rp := range []ReadPath{Drainer(DrainerOptions{CoalescePublishes: true}), Legacy(LegacyOptions{AutoDrain: true, CoalescePublishes: true})} {
		t.Run(rp.Mode(), func(t *testing.T) {
			const queue, publishers, total = "test.groupcommit.acks", 4, 5000
			conn, cchs, end := ackBroker(t, rp, queue, 1)
			defer end()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			delivered := map[string]bool{}
			consumed := consumeAcking(ctx, cchs, queue, total, func(body string) error {
				if delivered[body] {
					return fmt.Errorf("message %s delivered twice", body)
				}
				delivered[body] = true
				return nil
			})
			var wg sync.WaitGroup
			errs := make(chan error, publishers)
			for p := 0; p < publishers; p++ {
				wg.Add(1)
				go func(p int) {
					defer wg.Done()
					errs <- publishConfirmed(ctx, conn, queue, p*total/publishers, (p+1)*total/publishers)
				}(p)
			}
			wg.Wait()
			for p := 0; p < publishers; p++ {
				if err := <-errs; err != nil {
					t.Fatalf("publisher: %v", err)
				}
			}
			if err := <-consumed; err != nil || len(delivered) != total {
				t.Fatalf("consumer: %d of %d delivered and acked: %v", len(delivered), total, err)
			}
			if err := cchs[0].Close(); err != nil {
				t.Fatalf("closing the consumer's channel: %v", err)
			}
			ch, err := conn.Channel()
			if err != nil {
				t.Fatalf("Channel: %v", err)
			}
			q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
			if err != nil || q.Messages != 0 || q.Consumers != 0 {
				t.Fatalf("the queue after: %+v, %v; want empty, with no consumer", q, err)
			}
			st := conn.Stats()
			t.Logf("%d socket writes for %d publishes and %d acks; %d publishes coalesced", st.Writes, total, total, st.CoalescedPublishes)
		})
	}
}

// publishConfirmed publishes messages from to to (their numbers as bodies) on a channel of
// its own in confirm mode, and waits for every confirmation.
func publishConfirmed(ctx context.Context, conn *Connection, queue string, from, to int) error {
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		return err
	}
	dcs := make([]*DeferredConfirmation, 0, to-from)
	for i := from; i < to; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, Publishing{Body: []byte(strconv.Itoa(i))})
		if err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		dcs = append(dcs, dc)
	}
	for i, dc := range dcs {
		if ack, err := dc.WaitContext(ctx); !ack || err != nil {
			return fmt.Errorf("message %d: ack %v, %v", from+i, ack, err)
		}
	}
	return ch.Close()
}

// BenchmarkAckGroupCommit: in drainer mode, ConsumeFuncs ack every delivery (one consumer,
// then eight, each on a channel of its own) while 8 publishers on other channels of the same
// connection publish 50,000 messages of 512 bytes (no confirms), with CoalescePublishes off and
// on, three reps of each, alternated: write system calls (/proc/self/io syscw) and socket writes
// (Stats().Writes) per message, and the process's CPU seconds per 100,000 (getrusage), from
// the first publish to the last ack. It ignores b.N:
//
//	go test -tags integration -run '^$' -bench AckGroupCommit -benchtime 1x .
func BenchmarkAckGroupCommit(b *testing.B) {
	const reps = 3
	for _, consumers := range []int{1, 8} {
		var runs [2][]string // off, on
		for rep := 0; rep < reps; rep++ {
			for i, coalesce := range []bool{false, true} {
				runs[i] = append(runs[i], benchAcks(b, consumers, coalesce))
			}
		}
		for i, coalesce := range []bool{false, true} {
			b.Logf("%d consumer(s), coalescing %-5v: %s", consumers, coalesce, strings.Join(runs[i], "; "))
		}
	}
	b.Log("each rep: write syscalls / socket writes per message (publish + ack), CPU-s per 100k, wall")
}

func benchAcks(b *testing.B, consumers int, coalesce bool) string {
	const queue, publishers, total = "test.groupcommit.bench", 8, 50_000
	conn, cchs, end := ackBroker(b, Drainer(DrainerOptions{CoalescePublishes: coalesce}), queue, consumers)
	defer end()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	chans := make([]*Channel, publishers)
	for i := range chans {
		var err error
		if chans[i], err = conn.Channel(); err != nil {
			b.Fatalf("Channel: %v", err)
		}
	}
	body := make([]byte, 512)
	syscw, cpu, writes, start := benchSyscw(b), benchCPU(b), conn.Stats().Writes, time.Now()
	consumed := consumeAcking(ctx, cchs, queue, total, func(string) error { return nil })
	errs := make(chan error, publishers)
	for _, ch := range chans {
		go func(ch *Channel) {
			for i := 0; i < total/publishers; i++ {
				if err := ch.PublishWithContext(ctx, "", queue, false, false, Publishing{Body: body}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}(ch)
	}
	for range chans {
		if err := <-errs; err != nil {
			b.Fatalf("publish: %v", err)
		}
	}
	if err := <-consumed; err != nil {
		b.Fatalf("consumers: %v", err)
	}
	return fmt.Sprintf("%.3f / %.3f, %.3f, %s", float64(benchSyscw(b)-syscw)/total, float64(conn.Stats().Writes-writes)/total,
		(benchCPU(b)-cpu).Seconds()*100_000/total, time.Since(start).Round(time.Millisecond))
}
