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
