package failover

import (
	"context"
	"fmt"
	"sync"
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
