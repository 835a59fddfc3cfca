package legacyread_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/legacyread"
)

// A consumer in legacy mode runs a drain loop: deliveries reach the Consume
// chan only while someone calls DrainEvents, which also sends heartbeats.
func ExampleDial_drainLoop() {
	conn, err := legacyread.Dial("amqp://guest:guest@127.0.0.1:5672/", legacyread.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("jobs", "", true, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := conn.DrainEvents(ctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return // amqp.ErrClosedIntentionally after Close
			}
		}
	}()
	for d := range deliveries {
		log.Printf("got %q", d.Body)
	}
}
