package drainer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
)

// A publisher with confirms in drainer mode. Nothing here has to read the
// NotifyPublish listener promptly for the rest of the connection to keep
// working: confirmations wait in the channel's outbox.
func ExampleDial() {
	conn, err := drainer.Dial("amqp://guest:guest@127.0.0.1:5672/", drainer.Options{})
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
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false,
		amqp.Publishing{ContentType: "text/plain", Body: []byte("hello")})
	if err != nil {
		log.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		log.Fatalf("not confirmed: %v", err)
	}
	log.Printf("%s read mode: published and confirmed", conn.ReadMode())
}

// Telling a deliberate shutdown from a failure: waiters released by Close
// get amqp.ErrClosedIntentionally, which is an amqp.ErrClosed that must not
// be retried.
func ExampleDialConfig_closedIntentionally() {
	conn, err := drainer.DialConfig("amqp://guest:guest@127.0.0.1:5672/",
		amqp.Config{Heartbeat: 10 * time.Second}, drainer.Options{CloseTimeout: 2 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for {
			if err := conn.DrainEvents(context.Background()); err != nil {
				done <- err
				return
			}
		}
	}()
	_ = conn.Close()
	err = <-done
	switch {
	case errors.Is(err, amqp.ErrClosedIntentionally):
		log.Print("closed on purpose: do not reconnect")
	case errors.Is(err, amqp.ErrClosed):
		log.Print("connection lost: reconnect")
	}
}

// A consumer in drainer mode. Nothing else changes from upstream: the
// drainer reads, and a handler that falls behind makes it pause reading at
// the budget instead of buffering without limit.
func ExampleDial_consumer() {
	conn, err := drainer.Dial("amqp://guest:guest@127.0.0.1:5672/", drainer.Options{Budget: 16 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Qos(100, 0, false); err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("jobs", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for d := range deliveries {
		log.Printf("got %q", d.Body)
		_ = d.Ack(false)
	}
}

// Pooled consumption: ConsumeFunc hands each delivery to a handler and
// recycles its body when the handler returns, so a steady consumer
// allocates no body per message. The body, and the *Delivery itself, are
// valid only inside the handler: copy what must outlive it.
func ExampleConsumeFunc() {
	conn, err := drainer.Dial("amqp://guest:guest@127.0.0.1:5672/", drainer.Options{})
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
	for _, body := range []string{"one", "two", "three"} {
		if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false,
			amqp.Publishing{Body: []byte(body)}); err != nil {
			log.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var kept [][]byte
	err = drainer.ConsumeFunc(ctx, ch, q.Name, amqp.ConsumeFuncOptions{},
		func(d *amqp.Delivery) error {
			fmt.Printf("%s\n", d.Body)               // fine: inside the handler
			kept = append(kept, bytes.Clone(d.Body)) // a copy may be kept
			if len(kept) == 3 {
				cancel() // ConsumeFunc cancels the consumer and returns ctx.Err()
			}
			return d.Ack(false)
		})
	fmt.Println(errors.Is(err, context.Canceled), len(kept))
	// Output:
	// one
	// two
	// three
	// true 3
}

// Warnings and a snapshot of what the drainer holds. With a Logger, a
// listener left unread is reported long before it fills the budget; Stats
// shows who holds what at any time, from any goroutine.
func ExampleOptions_logger() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	conn, err := drainer.Dial("amqp://guest:guest@127.0.0.1:5672/", drainer.Options{
		Logger:              logger,          // nil: silent
		StallWarning:        2 * time.Second, // default 5 s
		DropStalledListener: time.Minute,     // default: never drop
	})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	s := conn.Stats()
	fmt.Printf("%s: %d of %d budget bytes used, paused %d times\n",
		s.Mode, s.Budget.Used, s.Budget.Limit, s.Budget.Pauses)
	for _, l := range s.Listeners {
		fmt.Printf("channel %d %s: %d waiting (%d bytes), oldest %s\n",
			l.Channel, l.Kind, l.Queued, l.QueuedBytes, l.OldestAge)
	}
	for _, c := range s.Consumers {
		fmt.Printf("consumer %q on channel %d: %d waiting\n", c.ConsumerTag, c.Channel, c.Queued)
	}
}

// Blocking reads: the socket is read with blocking read(2) on the reading goroutine's
// thread, not through Go's network poller, which costs about a third less CPU per delivery
// and an OS thread per connection. The drainer mode and everything else are as usual.
func ExampleBlockingDialer() {
	cfg := amqp.Config{Dial: drainer.BlockingDialer(nil, 30*time.Second)}
	conn, err := drainer.DialConfig("amqp://guest:guest@127.0.0.1:5672/", cfg, drainer.Options{})
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
	deliveries, err := ch.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ch.PublishWithContext(ctx, "", q.Name, false, false,
		amqp.Publishing{Body: []byte("read by a blocking read(2)")}); err != nil {
		log.Fatal(err)
	}
	select {
	case d := <-deliveries:
		fmt.Printf("%s: %s\n", conn.ReadMode(), d.Body)
	case <-ctx.Done():
		log.Fatal("nothing delivered")
	}
	// Output:
	// drainer: read by a blocking read(2)
}
