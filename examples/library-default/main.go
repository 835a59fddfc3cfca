// Command library-default runs a connection that a library dials, here
// stood in for by dialFromLibrary (a plain amqp.Dial that nobody may edit),
// in drainer mode, through the process-wide switch: one call early in main.
// Setting AMQP091_READ_MODE=drainer in the environment instead does the same
// with no code at all; SetDefaultReadPath, when called, wins over it.
//
//	go run ./examples/library-default                     # drainer, set in code
//	AMQP091_READ_MODE=drainer go run ./examples/library-default -env
package main

import (
	"flag"
	"fmt"
	"log"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"
)

// dialFromLibrary is what watermill, gocloud and the like do inside: dial
// with no Config.ReadPath.
func dialFromLibrary(url string) (*amqp.Connection, error) {
	return amqp.Dial(url)
}

func main() {
	fromEnv := flag.Bool("env", false, "leave the choice to AMQP091_READ_MODE")
	flag.Parse()
	if !*fromEnv {
		// Before any library dials: a connection keeps the mode it was
		// opened with, through every recovery.
		amqp.SetDefaultReadPath(amqp.Drainer(amqp.DrainerOptions{}))
	}
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := dialFromLibrary(url)
	if err != nil {
		// An invalid AMQP091_READ_MODE (a typo, or plain "legacy") fails
		// every dial: it is never a silent fallback to upstream.
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
	fmt.Printf("a library's amqp.Dial runs in %s mode: declared %s\n", conn.ReadMode(), q.Name)
}
