package drainer_test

import (
	"bytes"
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
)

// heapWatch samples the heap until stopped and reports the peak.
func heapWatch() (stop func() uint64) {
	done := make(chan struct{})
	peak := make(chan uint64, 1)
	go func() {
		var max uint64
		var ms runtime.MemStats
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > max {
				max = ms.HeapAlloc
			}
			select {
			case <-done:
				peak <- max
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-peak }
}

// TestBudgetBoundsAConsumerThatDoesNotRead floods a consumer that does not
// read its delivery chan. The drainer stops reading at the budget, so the
// heap stays near it while the broker holds the rest; once the consumer
// reads, every message arrives.
func TestBudgetBoundsAConsumerThatDoesNotRead(t *testing.T) {
	const (
		budget = 8 << 20
		size   = 128 << 10
		count  = 512 // 64 MiB in all: eight budgets
	)
	conn, err := drainerDial(testenv.AMQPURL(t), amqp.Config{}, drainer.Options{Budget: budget})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The publisher has its own connection: on a shared one, the confirms
	// it waits for would queue behind the deliveries the consumer leaves
	// unread, which is exactly the backpressure under test. The queue is
	// durable because it spans two connections (RabbitMQ 4.3 refuses
	// transient non-exclusive queues), and deleted at the end.
	pubConn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pubConn.Close()
	pubCh := testenv.Channel(t, pubConn)
	q := "drainer-test-budget-" + t.Name()
	if _, err := pubCh.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = testenv.Channel(t, pubConn).QueueDelete(q, false, false, false) }()
	if _, err := pubCh.QueuePurge(q, false); err != nil {
		t.Fatal(err)
	}

	consumerCh, otherCh := testenv.Channel(t, conn), testenv.Channel(t, conn)
	deliveries, err := consumerCh.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otherCh.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
		t.Fatalf("an RPC on another channel before the budget is reached: %v", err)
	}

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	stop := heapWatch()

	if err := pubCh.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte{'m'}, size)
	ctx := context.Background()
	for i := 0; i < count; i++ {
		dc, err := pubCh.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{Body: body})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if i == count-1 {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				t.Fatalf("last confirm: %v %v", ok, err)
			}
		}
	}
	peak := stop()
	grew := int64(peak) - int64(base.HeapAlloc)
	t.Logf("published %d MiB to a consumer that does not read; heap grew by at most %.1f MiB (budget %d MiB)",
		count*size>>20, float64(grew)/(1<<20), budget>>20)
	if limit := int64(4 * budget); grew > limit {
		t.Fatalf("heap grew by %d bytes, want within %d (a few budgets)", grew, limit)
	}

	for i := 0; i < count; i++ {
		select {
		case d := <-deliveries:
			if len(d.Body) != size {
				t.Fatalf("delivery %d has %d bytes, want %d", i, len(d.Body), size)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d deliveries arrived after the consumer started reading", i, count)
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestFragmentedFrameCostsNoCPU: one 131,072-byte body frame arrives in
// 512-byte slices at 16 KB/s. It arrives intact, and the drainer waits
// between slices instead of spinning: the process uses under 5% of one
// core over the delivery.
func TestFragmentedFrameCostsNoCPU(t *testing.T) {
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	conn := dial(t, proxy.URL(), amqp.Config{})
	ch := testenv.Channel(t, conn)
	q := testenv.ExclusiveQueue(t, ch)
	deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("0123456789abcdef"), (131072-8)/16)
	proxy.Bandwidth(toxi.Downstream, 16)
	proxy.Slicer(toxi.Downstream, 512, 0, 0)

	runtime.GC()
	start, cpu0 := time.Now(), cpuTime()
	if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: body}); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-deliveries:
		if !bytes.Equal(d.Body, body) {
			t.Fatalf("the fragmented body arrived corrupted (%d bytes)", len(d.Body))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the fragmented delivery never arrived")
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	ratio := cpu.Seconds() / elapsed.Seconds()
	t.Logf("fragmented %d-byte body: %s to arrive, %s of CPU (%.4f of a core)", len(body), elapsed.Round(time.Millisecond), cpu, ratio)
	if ratio > 0.05 {
		t.Fatalf("the process used %.3f of a core while the frame trickled in, want under 0.05", ratio)
	}
}
