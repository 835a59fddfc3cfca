// Package queue holds the broker-side queue helpers that the no-loss and
// soak suites share: a durable queue that outlives every reset of the
// proxied connections, and reading it back afterwards.
package queue

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// Durable declares an empty durable queue named after prefix and the test,
// from a direct connection so that it survives every reset of the proxied
// ones, and deletes it when the test ends.
func Durable(t *testing.T, prefix string) string {
	t.Helper()
	conn := testenv.Dial(t, amqp.Config{})
	ch := testenv.Channel(t, conn)
	name := prefix + strings.ReplaceAll(t.Name(), "/", "-")
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueuePurge(name, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A fresh connection: the test's own may be gone by now.
		c, err := amqp.Dial(testenv.AMQPURL(t))
		if err != nil {
			t.Errorf("delete queue %s: %v", name, err)
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	})
	return name
}

// Drain empties q from a direct connection with basic.get, passing each
// delivery to found.
func Drain(t *testing.T, q string, found func(d amqp.Delivery)) {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch := testenv.Channel(t, conn)
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatalf("basic.get from %s: %v", q, err)
		}
		if !ok {
			return
		}
		found(d)
	}
}
