package drainer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// pooledQueue declares a fresh exclusive queue on ch holding n messages
// whose bodies are "message <i>" padded to size bytes, and returns its
// name.
func pooledQueue(t *testing.T, ch *amqp.Channel, n, size int) string {
	t.Helper()
	// Not auto-delete: it must outlive a cancelled consumer.
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q.Name, false, false,
			amqp.Publishing{Body: pooledBody(i, size)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("publish %d not confirmed: %v", i, err)
		}
	}
	return q.Name
}

func pooledBody(i, size int) []byte {
	b := []byte(fmt.Sprintf("message %d ", i))
	return append(b, bytes.Repeat([]byte{'.'}, size-len(b))...)
}

// TestConsumeFuncPoisonsRecycledBodies: a handler that keeps d.Body past
// its return finds it overwritten with PoisonByte by the next call, while
// every body it is handed is intact; cancelling ctx returns ctx's error
// after every delivery was handled, with nothing left behind (goleak).
func TestConsumeFuncPoisonsRecycledBodies(t *testing.T) {
	const n, size = 50, 4096
	conn, err := drainerDial(testenv.AMQPURL(t), amqp.Config{}, drainer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch := testenv.Channel(t, conn)
	q := pooledQueue(t, ch, n, size)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var kept []byte // the misuse under test: a body kept past its handler
	handled := 0
	err = ch.ConsumeFunc(ctx, q, amqp.ConsumeFuncOptions{AutoAck: true, PoisonRecycled: true},
		func(d *amqp.Delivery) error {
			if !bytes.Equal(d.Body, pooledBody(handled, size)) {
				t.Errorf("delivery %d: body %.20q…, want %.20q…", handled, d.Body, pooledBody(handled, size))
			}
			if kept != nil && !bytes.Equal(kept, bytes.Repeat([]byte{amqp.PoisonByte}, len(kept))) {
				t.Errorf("delivery %d: the previous body, kept past its handler, was not poisoned: %.20q…", handled, kept)
			}
			kept = d.Body
			handled++
			if handled == n {
				cancel()
			}
			return nil
		})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("ConsumeFunc returned %v, want context.Canceled", err)
	}
	if handled != n {
		t.Fatalf("handled %d deliveries, want %d", handled, n)
	}
}

// TestConsumeFuncHandlerErrorRequeues: the handler's error stops the
// consumer and is returned; the deliveries in flight are requeued, so a
// second consumer gets every message the first did not acknowledge.
func TestConsumeFuncHandlerErrorRequeues(t *testing.T) {
	const n, size = 20, 512
	conn, err := drainerDial(testenv.AMQPURL(t), amqp.Config{}, drainer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch := testenv.Channel(t, conn)
	q := pooledQueue(t, ch, n, size)
	stop := errors.New("stop")

	acked := 0
	err = ch.ConsumeFunc(context.Background(), q, amqp.ConsumeFuncOptions{},
		func(d *amqp.Delivery) error {
			if acked == 5 {
				return stop // not acknowledged: the broker requeues it on cancel + nack
			}
			acked++
			return d.Ack(false)
		})
	if !errors.Is(err, stop) {
		t.Fatalf("ConsumeFunc returned %v, want the handler's error", err)
	}
	// The failed delivery was neither acked nor nacked by anyone: close
	// the channel so that the broker requeues it too.
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := map[string]bool{}
	err = ch.ConsumeFunc(ctx, q, amqp.ConsumeFuncOptions{AutoAck: true}, func(d *amqp.Delivery) error {
		seen[string(d.Body)] = true
		if len(seen) == n-acked {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("second ConsumeFunc returned %v (saw %d of %d)", err, len(seen), n-acked)
	}
	for i := acked; i < n; i++ {
		if !seen[string(pooledBody(i, size))] {
			t.Errorf("message %d was lost", i)
		}
	}
}

// TestConsumeFuncEndsWithTheConnection: closing the connection while
// ConsumeFunc runs ends it with an error, not a hang.
func TestConsumeFuncEndsWithTheConnection(t *testing.T) {
	conn, err := drainerDial(testenv.AMQPURL(t), amqp.Config{}, drainer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ch := testenv.Channel(t, conn)
	q := pooledQueue(t, ch, 1, 64)
	handled := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- ch.ConsumeFunc(context.Background(), q, amqp.ConsumeFuncOptions{AutoAck: true},
			func(*amqp.Delivery) error {
				handled <- struct{}{}
				return nil
			})
	}()
	<-handled
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("ConsumeFunc returned nil after the connection closed")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ConsumeFunc still running 30s after the connection closed")
	}
}

// TestMessageLargerThanTheBudgetArrives: a message bigger than the whole
// budget, in many body frames, is assembled and delivered, not stuck
// behind a pause that only reading it could end: the bytes of a message
// still being assembled never pause the drainer.
func TestMessageLargerThanTheBudgetArrives(t *testing.T) {
	const budget, size = 256 << 10, 4 << 20 // 32 frames of 128 KiB
	conn, err := drainerDial(testenv.AMQPURL(t), amqp.Config{}, drainer.Options{Budget: budget})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch := testenv.Channel(t, conn)
	q := pooledQueue(t, ch, 1, size)
	deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-deliveries:
		if !bytes.Equal(d.Body, pooledBody(0, size)) {
			t.Fatalf("body of %d bytes differs from the %d published", len(d.Body), size)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a message larger than the budget did not arrive within 30s")
	}
}
