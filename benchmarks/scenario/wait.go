package scenario

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Small helpers the scenarios share: bounded waits, so that a wedged
// upstream reader can never hang a measurement, and unit conversions.

// closeWithin closes conn, waiting at most d. Upstream's Close can wait
// behind a reader that is wedged in a notification or dead with its
// socket; a benchmark reports that elsewhere and must not hang on it.
func closeWithin(conn *amqp.Connection, d time.Duration) {
	within(d, func() { _ = conn.Close() })
}

// within runs f and waits for it at most d, reporting whether it
// returned. If it did not, it is left running: the scenario's process
// exits soon after.
func within(d time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// sleepCtx sleeps for d, or until ctx ends, whose error it then returns.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// boolMetric is 1 for true, 0 for false.
func boolMetric(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// millis converts d to the reports' unit.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// waitFor polls cond every 5 ms until it holds, ctx ends or timeout
// passes, and reports whether it held.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
