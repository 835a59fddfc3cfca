package failover_test

import (
	"context"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/failover"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A publisher over a three-node cluster: round robin over the nodes, so
// that a node just abandoned is not the first one retried.
func Example() {
	urls := []string{
		"amqp://guest:guest@10.200.0.1:5672/",
		"amqp://guest:guest@10.200.0.2:5672/",
		"amqp://guest:guest@10.200.0.3:5672/",
	}
	var next atomic.Uint64
	dial := func(ctx context.Context) (*amqp.Connection, error) {
		u := urls[next.Add(1)%uint64(len(urls))]
		return compat.Dial(u, compat.Drainer)
	}

	ctx := context.Background()
	p, err := failover.NewPublisher(ctx, failover.PublisherOptions{
		Dial:           dial,
		MaxOutstanding: 1000,
		ConfirmTimeout: 5 * time.Second, // a node cut off from its peers confirms nothing
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	// Publish returns once the broker confirmed the message; after a
	// failover it may be in the queue twice, with the same MessageId.
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = p.Publish(pctx, "", "orders", false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    "order-42", // or leave empty: the publisher assigns one
		Body:         []byte("..."),
	})
	if err != nil {
		log.Fatal(err)
	}

	// The consumer side: ack on nil, requeue on error, re-consume after a
	// loss; drop duplicates by MessageId.
	seen := map[string]bool{}
	cctx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	_ = failover.Consume(cctx, failover.ConsumerOptions{Dial: dial, Queue: "orders", Prefetch: 100},
		func(ctx context.Context, d amqp.Delivery) error {
			if seen[d.MessageId] {
				return nil // a duplicate: ack it, do nothing
			}
			seen[d.MessageId] = true
			fmt.Println("order", d.MessageId)
			return nil
		})
	fmt.Printf("%+v\n", p.Stats())
}
