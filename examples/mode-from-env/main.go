// Command mode-from-env picks its read mode from AMQP091_READ_MODE
// (upstream, legacy, drainer or legacy-autodrain; unset means upstream),
// so the same binary runs in any mode without a code change.
//
//	AMQP091_READ_MODE=drainer go run ./examples/mode-from-env
package main

import (
	"fmt"
	"log"
	"os"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
)

func main() {
	mode, err := compat.ModeFromEnv()
	if err != nil {
		log.Fatal(err) // a typo is an error, never a silent fallback
	}
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := compat.Dial(url, mode)
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
	fmt.Printf("read mode %s: declared %s\n", conn.ReadMode(), q.Name)
}
