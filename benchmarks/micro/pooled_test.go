//go:build !pristine

package micro

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// BenchmarkDeliverPooled is BenchmarkDeliver through Channel.ConsumeFunc,
// whose bodies come from a pool and go back to it when the handler
// returns (in upstream mode, which has no pool, ConsumeFunc hands over
// upstream's bodies). Pristine upstream has no ConsumeFunc: compare with
// its BenchmarkDeliver.
func BenchmarkDeliverPooled(b *testing.B) {
	forEach(b, func(b *testing.B, mode string, size int) {
		n := b.N
		p := fakepeer.Listen(b)
		encoded, release := serveDeliveries(p, n, size)
		conn := dial(b, p, mode, nil)
		ch, err := conn.Channel()
		if err != nil {
			b.Fatalf("channel: %v", err)
		}
		stop := scenario.StartDrainLoop(conn, mode, time.Second)
		defer stop()
		all := make(chan struct{})
		ended := make(chan error, 1)
		handled := 0
		go func() {
			ended <- ch.ConsumeFunc(context.Background(), "bench", amqp.ConsumeFuncOptions{Consumer: consumerTag, AutoAck: true},
				func(d *amqp.Delivery) error {
					if handled++; handled == n {
						close(all)
					}
					return nil
				})
		}()
		select {
		case <-encoded:
		case <-time.After(10 * time.Second): // the script failed; the peer reported why
			b.Fatal("the peer never encoded its deliveries")
		}

		b.ReportAllocs()
		b.ResetTimer()
		close(release)
		select {
		case <-all:
		case err := <-ended:
			b.Fatalf("ConsumeFunc ended after %d of %d: %v", handled, n, err)
		}
		b.StopTimer()
		// The peer answers no basic.cancel: end the consumption by closing.
		stop()
		_ = conn.Close()
		<-ended
	})
}
