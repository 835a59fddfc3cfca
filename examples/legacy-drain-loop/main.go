// Command legacy-drain-loop consumes in legacy (caller-drives-read) mode.
// Nothing reads the socket unless the program calls in, so a consumer
// runs a drain loop: DrainEvents reads and dispatches frames, and the
// deliveries then show up on the Consume chan.
//
//	go run ./examples/legacy-drain-loop   # AMQP_URL, default the local broker
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/legacyread"
)

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := legacyread.Dial(url, legacyread.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false, amqp.Publishing{Body: []byte(fmt.Sprint("hello ", i))}); err != nil {
			log.Fatal(err)
		}
	}

	// The drain loop: it also sends heartbeats while it runs.
	done := make(chan error, 1)
	go func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := conn.DrainEvents(ctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				done <- err // amqp.ErrClosedIntentionally after Close
				return
			}
		}
	}()
	for i := 0; i < 3; i++ {
		d := <-deliveries
		fmt.Printf("%s mode: got %q\n", conn.ReadMode(), d.Body)
	}
	if err := conn.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("drain loop ended:", <-done)
}
