// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

//go:build integration

package amqp091

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestConsumeFuncForgetsItsCloseListener: each ConsumeFunc registers a
// NotifyClose listener on its channel for as long as it runs, and removes
// it when it returns, so that consumptions one after another on a
// long-lived channel do not pile listeners up. It runs in whatever read mode
// the suite forces.
func TestConsumeFuncForgetsItsCloseListener(t *testing.T) {
	const queue = "test.consumefunc.forgets-close-listener"
	conn, ch := integrationQueue(t, queue)
	if conn == nil {
		t.Fatal("no broker")
	}
	defer drainWhilePlainLegacy(conn)()
	defer conn.Close()
	listeners := func() int {
		ch.notifyM.RLock()
		defer ch.notifyM.RUnlock()
		return len(ch.closes)
	}
	stopped := errors.New("handler stops the consumption")
	for i := 0; i < 3; i++ {
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false, Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		during := -1
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := ch.ConsumeFunc(ctx, queue, ConsumeFuncOptions{AutoAck: true}, func(*Delivery) error {
			during = listeners()
			return stopped
		})
		cancel()
		if !errors.Is(err, stopped) {
			t.Fatalf("round %d: ConsumeFunc = %v, want the handler's error", i, err)
		}
		if during != 1 {
			t.Fatalf("round %d: %d NotifyClose listeners while the handler ran, want ConsumeFunc's 1", i, during)
		}
		if n := listeners(); n != 0 {
			t.Fatalf("round %d: %d NotifyClose listeners after ConsumeFunc returned, want 0", i, n)
		}
	}
}

// drainWhilePlainLegacy runs, in pure legacy mode, the drain loop that
// deliveries need, until the connection is closed; the returned func
// waits for it.
func drainWhilePlainLegacy(conn *Connection) (wait func()) {
	l, ok := conn.rp.(*legacyConn)
	if !ok || l.opts.AutoDrain {
		return func() {}
	}
	drained := make(chan struct{})
	go func() { // a program's own drain loop, with a bound on each drain
		defer close(drained)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			err := conn.DrainEvents(ctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return // Close, or the connection's end
			}
		}
	}()
	return func() { <-drained }
}

// TestConsumeFuncEnds pins ConsumeFunc's own ends over the consumer loop,
// in whatever read mode the suite forces (upstream mode takes its
// deliveries from the Consume chan, the others from the inbox): ctx's end
// returns ctx's error, a handler's error returns that error and hands the
// handler nothing more. No delivery is lost: what the handler did not
// acknowledge comes back once the channel closes. How many reach the
// handler after ctx's end depends on how many the broker sent before its
// cancel-ok, so it is not pinned.
func TestConsumeFuncEnds(t *testing.T) {
	const queue = "test.consumefunc.ends"
	conn, ch := integrationQueue(t, queue)
	if conn == nil {
		t.Fatal("no broker")
	}
	defer drainWhilePlainLegacy(conn)()
	defer conn.Close()
	publish := func(n int) {
		for i := 0; i < n; i++ {
			if err := ch.PublishWithContext(context.Background(), "", queue, false, false, Publishing{Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(8)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stopCtx, stop := context.WithCancel(ctx)
	acked := 0
	err := ch.ConsumeFunc(stopCtx, queue, ConsumeFuncOptions{}, func(d *Delivery) error {
		if acked++; acked == 3 {
			stop()
		}
		return d.Ack(false)
	})
	if !errors.Is(err, context.Canceled) || acked < 3 {
		t.Fatalf("after ctx's end: ConsumeFunc = %v with %d handled, want context.Canceled with 3 or more", err, acked)
	}
	publish(3) // the first round may have taken all 8
	failed := errors.New("handler fails")
	handled := 0
	err = ch.ConsumeFunc(ctx, queue, ConsumeFuncOptions{}, func(*Delivery) error {
		handled++
		return failed
	})
	if !errors.Is(err, failed) || handled != 1 {
		t.Fatalf("after a handler's error: ConsumeFunc = %v with %d handled, want the handler's error with 1", err, handled)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	ch2, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The broker requeues asynchronously: wait for the deliveries.
	want, got, all := 11-acked, 0, errors.New("all requeued")
	err = ch2.ConsumeFunc(ctx, queue, ConsumeFuncOptions{AutoAck: true}, func(*Delivery) error {
		if got++; got == want {
			return all
		}
		return nil
	})
	if !errors.Is(err, all) {
		t.Fatalf("%d of the %d not acknowledged came back (%v)", got, want, err)
	}
}
