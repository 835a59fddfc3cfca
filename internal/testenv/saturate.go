package testenv

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// SaturateAndClose runs a publisher of 1 KiB bodies without pause and an
// auto-ack consumer of the same server-named queue on conn, closes conn
// once the consumer has received enough to be sure that the broker has a
// backlog, and counts the deliveries received before Close and after
// DrainEvents said that it had begun (ErrClosedIntentionally, the
// drainer's and legacy's public sign of it). In legacy mode DrainEvents
// is also what reads. conn is closed when it returns. Issue #17.
func SaturateAndClose(t testing.TB, conn *amqp.Connection) (after, before int64) {
	t.Helper()
	consumerCh, publisherCh := Channel(t, conn), Channel(t, conn)
	q := ExclusiveQueue(t, consumerCh)
	deliveries, err := consumerCh.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var begun atomic.Bool // DrainEvents returned ErrClosedIntentionally
	var received, afterBegun atomic.Int64
	busy := make(chan struct{}) // closed at the 2,000th delivery
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for range deliveries {
			if received.Add(1) == 2000 {
				close(busy)
			}
			if begun.Load() {
				afterBegun.Add(1)
			}
		}
	}()
	go func() {
		defer wg.Done()
		body := make([]byte, 1024)
		for publisherCh.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: body}) == nil {
		}
	}()
	go func() {
		defer wg.Done()
		for {
			// Bounded, as a legacy application's drain loop is (and as
			// LegacyOptions.AutoDrain's 50 ms): in plain legacy mode a
			// write waits for the read in progress, and an unbounded read
			// would hold the publisher back whenever the broker has
			// nothing in flight, until the next heartbeat (a run of
			// 2026-12-03 got 711 deliveries in 30 s that way).
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			err := conn.DrainEvents(ctx)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			if errors.Is(err, amqp.ErrClosedIntentionally) {
				begun.Store(true)
				return
			}
			if err != nil {
				t.Errorf("DrainEvents = %v before Close", err)
				return
			}
		}
	}()
	select {
	case <-busy:
	case <-time.After(30 * time.Second):
		t.Fatalf("the consumer received only %d deliveries in 30s", received.Load())
	}
	before = received.Load()
	if err := conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		t.Logf("Close = %v", err) // the watchdog, on a broker too slow with the backlog: still bounded
	}
	wg.Wait()
	if !begun.Load() {
		t.Fatal("DrainEvents never returned ErrClosedIntentionally")
	}
	return afterBegun.Load(), before
}
