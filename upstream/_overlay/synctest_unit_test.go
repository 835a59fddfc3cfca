// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"os"
	"testing"
	"testing/synctest"
)

// The unit tests of the concurrency building blocks (budget, outbox,
// serialQueue, genEnd and closeIntent, blockGate: *_unit_test.go) run in a
// synctest bubble: a fake clock that moves only when every goroutine of the
// bubble is blocked, so a slice, a deadline or a watchdog is asserted at
// its exact time, with no broker, no socket and no real waiting.

// inBubble runs f in a synctest bubble.
//
// upstream's go.mod says go 1.20, so this test binary defaults to
// GODEBUG asynctimerchan=1 (pre-1.23 timer channels), under which
// synctest.Test panics. The setting is switched to Go 1.23 timers for the
// test's duration only, as the time package's own tests do: upstream's
// suite keeps the timers of its go.mod, and timers made before the switch
// keep theirs. t.Setenv also makes the test refuse t.Parallel, so nothing
// runs beside it under the switched setting.
func inBubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	godebug := "asynctimerchan=0"
	if prev := os.Getenv("GODEBUG"); prev != "" {
		godebug = prev + "," + godebug // the last setting wins
	}
	t.Setenv("GODEBUG", godebug)
	synctest.Test(t, f)
}
