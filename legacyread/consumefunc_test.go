package legacyread_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/legacyread"
)

// TestConsumeFuncInLegacyMode: with a drain loop reading, ConsumeFunc
// hands every delivery over intact, with pooled bodies (a body kept past
// its handler reads as poison), and returns ctx's error on cancel.
func TestConsumeFuncInLegacyMode(t *testing.T) {
	const n, size = 30, 2048
	conn, err := legacyread.Dial(testenv.AMQPURL(t), legacyread.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch := testenv.Channel(t, conn)
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := func(i int) []byte {
		b := []byte(fmt.Sprintf("message %d ", i))
		return append(b, bytes.Repeat([]byte{'.'}, size-len(b))...)
	}
	for i := 0; i < n; i++ {
		if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false,
			amqp.Publishing{Body: body(i)}); err != nil {
			t.Fatal(err)
		}
	}
	drainCtx, stopDrain := context.WithCancel(context.Background())
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		// Short reads, as a legacy application's loop makes them: a write
		// (ConsumeFunc's basic.cancel) waits for the read in progress.
		for drainCtx.Err() == nil {
			c, done := context.WithTimeout(drainCtx, 50*time.Millisecond)
			err := conn.DrainEvents(c)
			timedOut := c.Err() != nil
			done()
			if err != nil && !timedOut {
				return
			}
		}
	}()
	defer func() { stopDrain(); <-drained }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var kept []byte
	handled := 0
	err = ch.ConsumeFunc(ctx, q.Name, amqp.ConsumeFuncOptions{AutoAck: true, PoisonRecycled: true},
		func(d *amqp.Delivery) error {
			if !bytes.Equal(d.Body, body(handled)) {
				t.Errorf("delivery %d: body %.20q…", handled, d.Body)
			}
			if kept != nil && !bytes.Equal(kept, bytes.Repeat([]byte{amqp.PoisonByte}, len(kept))) {
				t.Errorf("delivery %d: the body kept from the previous one was not poisoned", handled)
			}
			kept = d.Body
			if handled++; handled == n {
				cancel()
			}
			return nil
		})
	if !errors.Is(err, context.Canceled) || handled != n {
		t.Fatalf("ConsumeFunc returned %v after %d of %d deliveries", err, handled, n)
	}
}

// TestConsumeFuncReadsByItself: with nobody calling DrainEvents,
// ConsumeFunc reads the socket itself (as rabbitmq-c's
// amqp_consume_message does) and hands every delivery over in order, the
// handler's acks going out between its reads; a handler's error ends it
// and requeues what had arrived unhandled, so that a second consumption
// gets every message not acked.
func TestConsumeFuncReadsByItself(t *testing.T) {
	const n, failAt = 300, 120
	ch := testenv.Channel(t, dial(t, "", amqp.Config{}))
	// Exclusive but not auto-delete: it must outlive the first consumer.
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	queue := q.Name
	for i := 0; i < n; i++ {
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false,
			amqp.Publishing{Body: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	// A ctx that never ends (its Done is nil): the handler's error ends
	// the consumption.
	stop := errors.New("handler stops")
	handled := 0
	err = ch.ConsumeFunc(context.Background(), queue, amqp.ConsumeFuncOptions{}, func(d *amqp.Delivery) error {
		if want := fmt.Sprint(handled); string(d.Body) != want {
			t.Errorf("delivery %d: body %q, want %q", handled, d.Body, want)
		}
		if handled == failAt {
			// Requeued by the handler; the ones in flight behind it, by
			// ConsumeFunc.
			if err := d.Nack(false, true); err != nil {
				t.Error(err)
			}
			return stop
		}
		handled++
		return d.Ack(false)
	})
	if !errors.Is(err, stop) || handled != failAt {
		t.Fatalf("ConsumeFunc returned %v after %d deliveries, want the handler's error after %d", err, handled, failAt)
	}

	// Again, to the end: every message not acked arrives (the requeue is
	// the broker's, and may take a moment), and ctx's cancel ends the
	// consumption once they have.
	seen := map[string]bool{}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	err = ch.ConsumeFunc(ctx2, queue, amqp.ConsumeFuncOptions{AutoAck: true}, func(d *amqp.Delivery) error {
		seen[string(d.Body)] = true
		if len(seen) == n-failAt {
			cancel2()
		}
		return nil
	})
	for i := failAt; i < n; i++ {
		if !seen[fmt.Sprint(i)] {
			t.Errorf("message %d, not acked, never came back", i)
		}
	}
	if !errors.Is(err, context.Canceled) || len(seen) != n-failAt {
		t.Fatalf("second ConsumeFunc returned %v after %d messages, want context.Canceled after %d", err, len(seen), n-failAt)
	}
}

// TestConsumeFuncReadingLetsWritesThrough: a ConsumeFunc waiting on an
// empty queue sits in a read of its own, which nobody asked to block: a
// publish from another goroutine cuts it short instead of waiting for a
// frame, and ctx's end ends the consumption. The heartbeat is the
// broker's (60 s by default: Config.Heartbeat 0 takes it), so that within
// the bound nothing but the cut ends the read.
func TestConsumeFuncReadingLetsWritesThrough(t *testing.T) {
	conn := dial(t, "", amqp.Config{})
	consumer := testenv.Channel(t, conn)
	idle := testenv.ExclusiveQueue(t, consumer)
	publisher := testenv.Channel(t, conn)
	other := testenv.ExclusiveQueue(t, publisher)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reading := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		close(reading)
		ended <- consumer.ConsumeFunc(ctx, idle, amqp.ConsumeFuncOptions{}, func(*amqp.Delivery) error { return nil })
	}()
	<-reading
	// Whether or not ConsumeFunc is in its read yet, each publish must
	// get through; a few make it likely that one meets the read.
	for i := 0; i < 20; i++ {
		start := time.Now()
		if err := publisher.PublishWithContext(context.Background(), "", other, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("publish %d took %v: it waited for ConsumeFunc's read", i, d)
		}
	}
	cancel()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ConsumeFunc returned %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ConsumeFunc did not return within 30 s of its ctx's end")
	}
}
