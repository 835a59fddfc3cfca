// Command modeprobe dials the broker the way the third-party libraries do,
// with no Config.ReadPath, and prints the read mode the patched amqp091-go
// gave the connection. scripts/thirdparty-tests runs it before each patched
// mode's suites, so that a mode that did not take effect (a tree without
// the process switch, a refused AMQP091_READ_MODE) fails loudly instead of
// running the suites in upstream mode under another name. It builds only
// against the patched tree: the pristine release has no ReadMode.
package main

import (
	"fmt"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "modeprobe:", err)
		os.Exit(1)
	}
	defer conn.Close()
	fmt.Println(conn.ReadMode())
}
