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
	s := &saturation{busy: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		s.consume(deliveries)
	}()
	go func() {
		defer wg.Done()
		publishUntilClosed(publisherCh, q)
	}()
	go func() {
		defer wg.Done()
		s.drainUntilClose(t, conn)
	}()
	select {
	case <-s.busy:
	case <-time.After(30 * time.Second):
		t.Fatalf("the consumer received only %d deliveries in 30s", s.received.Load())
	}
	before = s.received.Load()
	if err := conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		t.Logf("Close = %v", err) // the watchdog, on a broker too slow with the backlog: still bounded
	}
	wg.Wait()
	if !s.begun.Load() {
		t.Fatal("DrainEvents never returned ErrClosedIntentionally")
	}
	return s.afterBegun.Load(), before
}

// saturation is what SaturateAndClose's consumer and drain loop share.
type saturation struct {
	begun      atomic.Bool // DrainEvents returned ErrClosedIntentionally
	received   atomic.Int64
	afterBegun atomic.Int64  // received once begun was set
	busy       chan struct{} // closed at the 2,000th delivery
}

// consume counts the deliveries until the channel closes with conn.
func (s *saturation) consume(deliveries <-chan amqp.Delivery) {
	for range deliveries {
		if s.received.Add(1) == 2000 {
			close(s.busy)
		}
		if s.begun.Load() {
			s.afterBegun.Add(1)
		}
	}
}

// publishUntilClosed publishes 1 KiB bodies to q without pause until a
// publish fails, as it does once the connection is closed.
func publishUntilClosed(ch *amqp.Channel, q string) {
	msg := amqp.Publishing{Body: make([]byte, 1024)}
	for ch.PublishWithContext(context.Background(), "", q, false, false, msg) == nil {
	}
}

// drainUntilClose calls DrainEvents until it says that Close has begun.
func (s *saturation) drainUntilClose(t testing.TB, conn *amqp.Connection) {
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
			s.begun.Store(true)
			return
		}
		if err != nil {
			t.Errorf("DrainEvents = %v before Close", err)
			return
		}
	}
}
