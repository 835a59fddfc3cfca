package legacyread_test

import (
	"testing"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/legacyread"
)

// TestNoDeliveryAfterCloseBegins is issue #17 in legacy mode, where the
// test's DrainEvents loop is also what reads: once Close has begun
// (DrainEvents returns ErrClosedIntentionally), no delivery reaches the
// application but the one the consumer may already hold.
func TestNoDeliveryAfterCloseBegins(t *testing.T) {
	const trials = 3
	for i := 0; i < trials; i++ {
		conn, err := legacyread.Dial(testenv.AMQPURL(t), legacyread.Options{})
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
