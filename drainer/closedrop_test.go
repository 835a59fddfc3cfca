package drainer_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// TestNoDeliveryAfterCloseBegins is issue #17: under a publisher that
// saturates the connection, Close waits while the broker works through
// the publishes ahead of connection.close, and delivers them. Once Close
// has begun, none of those deliveries may reach the application. The
// moment Close has begun is what the public API shows of it: DrainEvents
// returns ErrClosedIntentionally. A delivery the consumer had already
// received then may still be counted, once; before the fix, thousands
// were handed over in that window.
func TestNoDeliveryAfterCloseBegins(t *testing.T) {
	const trials = 3
	for i := 0; i < trials; i++ {
		conn, err := drainerDial(brokerURL(t), amqp.Config{}, drainer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		after, before := testenv.SaturateAndClose(t, conn)
		t.Logf("trial %d: %d deliveries before Close, %d after it had begun", i, before, after)
		if after > 1 {
			t.Errorf("trial %d: %d deliveries reached the application after Close had begun, want at most the one already received", i, after)
		}
	}
}
