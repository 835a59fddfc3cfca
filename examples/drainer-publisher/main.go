// Command drainer-publisher publishes with publisher confirms in drainer
// mode. Its NotifyPublish listener is read slowly on purpose: in drainer
// mode that stalls nothing else on the connection, and no confirmation is
// dropped.
//
//	go run ./examples/drainer-publisher   # AMQP_URL, default the local broker
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
)

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := compat.Dial(url, compat.Drainer)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		log.Fatal(err)
	}

	const n = 100
	for i := 0; i < n; i++ {
		msg := amqp.Publishing{ContentType: "text/plain", Body: []byte(fmt.Sprint("message ", i))}
		if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false, msg); err != nil {
			log.Fatal(err)
		}
	}
	// An RPC while 99 confirmations wait for the listener: immediate in
	// drainer mode (upstream would stall it for 5 s per confirmation).
	start := time.Now()
	if _, err := ch.QueueDeclarePassive(q.Name, false, true, true, false, nil); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s mode: an RPC behind an unread confirm listener took %s\n", conn.ReadMode(), time.Since(start))

	acked := 0
	for i := 0; i < n; i++ {
		if c := <-confirms; c.Ack {
			acked++
		}
	}
	fmt.Printf("%d of %d publishes confirmed, in order\n", acked, n)
}
