// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

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
	if l, ok := conn.rp.(*legacyConn); ok && !l.opts.AutoDrain {
		// Pure legacy mode: deliveries need a drain loop, which ends
		// when the connection is closed.
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			l.autoDrain(l.current())
		}()
		defer func() { <-drained }()
	}
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
