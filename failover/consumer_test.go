package failover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The consumer's connection is cut mid-stream: it re-consumes through the
// other proxy, every message is handled, and the deliveries left unacked
// come back with Redelivered set.
func TestConsumerSurvivesConnectionLoss(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		queue, ch := durableQueue(t)
		const n = 500
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, false, false,
				amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i), Body: []byte("x")})
			if err != nil {
				t.Fatal(err)
			}
			if i == n-1 {
				dc.Wait()
			}
		}
		p1 := toxi.NewProxy(t, testenv.AMQPAddr(t))
		p2 := toxi.NewProxy(t, testenv.AMQPAddr(t))
		var log eventLog
		c, err := NewConsumer(ConsumerOptions{Dial: cycleDial(mode, p1.URL(), p2.URL()), Queue: queue, Prefetch: 50,
			OnEvent: log.add, Backoff: Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		seen := map[string]int{}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		all := make(chan struct{})
		cutReq := make(chan struct{})
		var cutOnce sync.Once
		runErr := make(chan error, 1)
		go func() {
			runErr <- c.Run(ctx, func(ctx context.Context, d amqp.Delivery) error {
				mu.Lock()
				seen[d.MessageId]++
				distinct := len(seen)
				mu.Unlock()
				if distinct == n/3 {
					cutOnce.Do(func() { close(cutReq) })
				}
				if distinct == n {
					select {
					case <-all:
					default:
						close(all)
					}
				}
				// The handler's work, not synchronisation: it keeps
				// deliveries unacked in flight when the cut lands.
				time.Sleep(200 * time.Microsecond)
				return nil
			})
		}()
		select {
		case <-cutReq:
			p1.Disable() // closes every connection through it
		case <-ctx.Done():
			t.Fatal("the consumer never got a third of the messages")
		}
		select {
		case <-all:
		case <-ctx.Done():
			mu.Lock()
			t.Fatalf("only %d of %d messages consumed; stats %+v", len(seen), n, c.Stats())
		}
		cancel()
		if err := <-runErr; err != context.Canceled {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
		p1.Enable()
		st := c.Stats()
		if st.Failovers < 1 || st.Connects < 2 {
			t.Fatalf("stats %+v, want ≥ 1 failover and 2 connects", st)
		}
		mu.Lock()
		dups := 0
		for _, k := range seen {
			dups += k - 1
		}
		mu.Unlock()
		t.Logf("stats %+v; %d duplicate deliveries", st, dups)
	})
}

// The broker cancels the consumer (its queue is deleted; a quorum
// queue's consumer timeout cancels the same way): Run counts the cancel,
// emits EventCancelled, backs off and consumes again on the same channel.
// The queue is still gone, so that fails and Run redials with its
// backoff; once the queue is back the consumer receives again.
func TestConsumerReconsumesAfterBrokerCancel(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		queue, ch := durableQueue(t)
		var log eventLog
		cancelled, lost := make(chan struct{}), make(chan struct{})
		var onceCancelled, onceLost sync.Once
		onEvent := func(e Event) {
			log.add(e)
			switch e.Kind {
			case EventCancelled:
				onceCancelled.Do(func() { close(cancelled) })
			case EventConnectionLost:
				onceLost.Do(func() { close(lost) })
			}
		}
		c, err := NewConsumer(ConsumerOptions{Dial: cycleDial(mode, testenv.AMQPURL(t)), Queue: queue,
			OnEvent: onEvent, Backoff: Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		got := make(chan string, 16)
		runErr := make(chan error, 1)
		go func() {
			runErr <- c.Run(ctx, func(_ context.Context, d amqp.Delivery) error {
				got <- d.MessageId
				return nil
			})
		}()
		publish := func(id string) {
			t.Helper()
			if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: id, Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
		receive := func(id string) {
			t.Helper()
			select {
			case m := <-got:
				if m != id {
					t.Fatalf("received %q, want %q", m, id)
				}
			case <-ctx.Done():
				t.Fatalf("%q not received: %v", id, ctx.Err())
			}
		}

		publish("m-0")
		receive("m-0")
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Fatal(err)
		}
		select {
		case <-cancelled:
		case <-ctx.Done():
			t.Fatal("no EventCancelled after the queue was deleted")
		}
		select {
		case <-lost:
		case <-ctx.Done():
			t.Fatal("consuming a deleted queue again did not end the session")
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		publish("m-1")
		receive("m-1")

		cancel()
		if err := <-runErr; err != context.Canceled {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
		s := c.Stats()
		t.Logf("%v: %+v", mode, s)
		if s.Cancels != 1 || s.Acked != 2 || s.Connects != 2 || s.Failovers < 1 {
			t.Errorf("stats %+v: want 1 cancel, 2 acked, 2 basic.consume and a failover (the queue was gone)", s)
		}
		if e, _ := log.first(EventCancelled); e.Count != 1 {
			t.Errorf("the first EventCancelled has Count %d, want 1", e.Count)
		}
	})
}

// The consumer's node freezes: the connection stays open and nothing
// comes back over it, neither deliveries nor heartbeats, as with a node
// whose VM is stopped. With heartbeats of a minute, only the probe can
// tell within the test's bound: the consumer asks basic.qos after
// ProbeAfter with no delivery, gets no answer, abandons the node and
// consumes through the other proxy.
func TestConsumerProbeLeavesAFrozenNode(t *testing.T) {
	forModes(t, func(t *testing.T, mode compat.Mode) {
		queue, ch := durableQueue(t)
		frozen := toxi.NewProxy(t, testenv.AMQPAddr(t))
		healthy := toxi.NewProxy(t, testenv.AMQPAddr(t))
		urls := []string{frozen.URL(), healthy.URL()}
		var dials atomic.Int64
		dial := func(ctx context.Context) (*amqp.Connection, error) {
			u := urls[int(dials.Add(1)-1)%len(urls)]
			return compat.DialConfig(u, amqp.Config{Heartbeat: time.Minute}, mode)
		}
		var log eventLog
		consuming := make(chan struct{}, 4)
		onEvent := func(e Event) {
			log.add(e)
			if e.Kind == EventConsuming {
				consuming <- struct{}{}
			}
		}
		c, err := NewConsumer(ConsumerOptions{Dial: dial, Queue: queue, OnEvent: onEvent,
			ProbeAfter: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		const n = 20
		var mu sync.Mutex
		seen := map[string]bool{}
		all := make(chan struct{})
		runErr := make(chan error, 1)
		go func() {
			runErr <- c.Run(ctx, func(ctx context.Context, d amqp.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				if seen[d.MessageId] = true; len(seen) == n {
					close(all)
				}
				return nil
			})
		}()
		select {
		case <-consuming:
		case <-ctx.Done():
			t.Fatal("the consumer never consumed through the first proxy")
		}
		frozen.Timeout(toxi.Downstream, 0)
		frozen.Timeout(toxi.Upstream, 0)
		for i := 0; i < n; i++ {
			if err := ch.PublishWithContext(ctx, "", queue, false, false,
				amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i), Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-all:
		case <-ctx.Done():
			t.Fatalf("%d of %d messages consumed after the freeze; stats %+v", len(seen), n, c.Stats())
		}
		cancel()
		if err := <-runErr; err != context.Canceled {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
		lost, ok := log.first(EventConnectionLost)
		if !ok || !strings.Contains(lost.Err.Error(), "did not answer a probe") || !errors.Is(lost.Err, amqp.ErrClosed) {
			t.Fatalf("first connection loss %+v (found %v): want the probe's, wrapping amqp.ErrClosed", lost, ok)
		}
		if st := c.Stats(); st.Failovers < 1 || st.Connects < 2 {
			t.Fatalf("stats %+v, want ≥ 1 failover and 2 connects", st)
		}
	})
}

// The probe's period: ProbeAfter, else half the negotiated heartbeat;
// off when negative or without heartbeats.
func TestConsumerProbePeriod(t *testing.T) {
	for _, tc := range []struct {
		probeAfter, heartbeat, want time.Duration
	}{
		{0, 2 * time.Second, time.Second},
		{300 * time.Millisecond, 2 * time.Second, 300 * time.Millisecond},
		{-1, 2 * time.Second, 0},
		{0, 0, 0},
	} {
		c := &Consumer{o: ConsumerOptions{ProbeAfter: tc.probeAfter}}
		timer, got := c.idleTimer(&amqp.Connection{Config: amqp.Config{Heartbeat: tc.heartbeat}})
		timer.Stop()
		if got != tc.want {
			t.Errorf("ProbeAfter %v, heartbeat %v: period %v, want %v", tc.probeAfter, tc.heartbeat, got, tc.want)
		}
	}
}
