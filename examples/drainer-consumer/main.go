// Command drainer-consumer consumes in drainer mode with a memory budget:
// if the handler falls behind, the drainer stops reading the socket once
// 8 MiB wait for it, instead of buffering without limit.
//
//	go run ./examples/drainer-consumer   # AMQP_URL, default the local broker
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
)

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := drainer.Dial(url, drainer.Options{Budget: 8 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		body := []byte(fmt.Sprint("job ", i))
		if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false, amqp.Publishing{Body: body}); err != nil {
			log.Fatal(err)
		}
	}
	for i := 0; i < 10; i++ {
		d := <-deliveries
		fmt.Printf("%s mode: got %q\n", conn.ReadMode(), d.Body)
		if err := d.Ack(false); err != nil {
			log.Fatal(err)
		}
	}
}
