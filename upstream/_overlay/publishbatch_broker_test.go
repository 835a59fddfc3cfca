// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

//go:build integration

package amqp091

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPublishBatchBrokerConfirms: 1,000 messages in batches of 100 on a confirm-mode
// channel are all acked, and arrive on their queue in order; with a read path each batch
// takes about one write. It runs in whatever read mode the suite forces.
func TestPublishBatchBrokerConfirms(t *testing.T) {
	const queue, batches, size = "test.publishbatch.confirms", 10, 100
	conn, ch := integrationQueue(t, queue)
	if conn == nil {
		t.Fatal("no broker")
	}
	defer drainWhilePlainLegacy(conn)()
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("Confirm: %v", err)
	}
	var dcs []*DeferredConfirmation
	writes := conn.Stats().Writes
	for b := 0; b < batches; b++ {
		batch := make([]BatchPublishing, size)
		for i := range batch {
			batch[i] = BatchPublishing{Key: queue, Msg: Publishing{Body: []byte(strconv.Itoa(b*size + i))}}
		}
		got, err := ch.PublishBatch(context.Background(), batch)
		if err != nil || len(got) != size {
			t.Fatalf("batch %d: %d confirmations, %v", b, len(got), err)
		}
		dcs = append(dcs, got...)
	}
	if n := conn.Stats().Writes - writes; conn.rp != nil && n > 2*batches {
		t.Errorf("%d batches took %d writes, want about one each", batches, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, dc := range dcs {
		if ack, err := dc.WaitContext(ctx); !ack || err != nil || dc.DeliveryTag != uint64(i+1) {
			t.Fatalf("message %d (tag %d): ack %v, %v", i, dc.DeliveryTag, ack, err)
		}
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("Consume: %v", err)
	}
	for i := 0; i < batches*size; i++ {
		select {
		case d := <-deliveries:
			if string(d.Body) != strconv.Itoa(i) {
				t.Fatalf("delivery %d: %q, out of order", i, d.Body)
			}
		case <-ctx.Done():
			t.Fatalf("%d of %d messages delivered in 30s", i, batches*size)
		}
	}
}

// BenchmarkPublishBatchSyscalls compares, in drainer mode, 100,000 publishes of 512 bytes
// made one by one (PublishWithContext) with the same in batches of 100 (PublishBatch):
// write system calls (/proc/self/io syscw) and socket writes (Stats().Writes) per message,
// and the process's CPU seconds (getrusage) per 100,000, three reps of each, alternated.
// The messages are unroutable, so the broker drops them. It ignores b.N:
//
//	go test -tags integration -run '^$' -bench PublishBatchSyscalls -benchtime 1x .
func BenchmarkPublishBatchSyscalls(b *testing.B) {
	const total, size, reps = 100_000, 100, 3
	cfg := defaultConfig()
	cfg.ReadPath = Drainer(DrainerOptions{})
	conn, err := DialConfig(amqpURL, cfg)
	if err != nil {
		b.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatalf("Channel: %v", err)
	}
	batch := make([]BatchPublishing, size)
	for i := range batch {
		batch[i] = BatchPublishing{Key: "test.publishbatch.nowhere", Msg: Publishing{Body: make([]byte, 512)}}
	}
	runs := map[string]func() error{
		"one by one": func() error {
			for i := 0; i < total; i++ {
				if err := ch.PublishWithContext(context.Background(), "", batch[0].Key, false, false, batch[0].Msg); err != nil {
					return err
				}
			}
			return nil
		},
		"batches of 100": func() error {
			for i := 0; i < total; i += size {
				if _, err := ch.PublishBatch(context.Background(), batch); err != nil {
					return err
				}
			}
			return nil
		},
	}
	for rep := 0; rep < reps; rep++ {
		for _, name := range []string{"one by one", "batches of 100"} {
			syscw, cpu, writes, start := benchSyscw(b), benchCPU(b), conn.Stats().Writes, time.Now()
			if err := runs[name](); err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			b.Logf("rep %d, %-14s: %.3f write syscalls and %.3f socket writes per message, %.3f CPU-s per 100k, %s wall",
				rep+1, name, float64(benchSyscw(b)-syscw)/total, float64(conn.Stats().Writes-writes)/total,
				(benchCPU(b)-cpu).Seconds()*100_000/total, time.Since(start).Round(time.Millisecond))
		}
	}
}

// benchSyscw is the process's write system calls so far (/proc/self/io).
func benchSyscw(b *testing.B) uint64 {
	io, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Fatalf("/proc/self/io: %v", err)
	}
	for _, line := range strings.Split(string(io), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	b.Fatal("/proc/self/io has no syscw")
	return 0
}

// benchCPU is the process's user and system CPU time so far.
func benchCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
