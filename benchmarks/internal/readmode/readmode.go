// Package readmode lets one benchmark program dial in any read mode,
// whichever build compiles it. The A/B suite compiles the same scenarios
// twice: against pristine upstream amqp091-go (build tag "pristine",
// go.upstream.mod), which has only upstream's reader goroutine, and against
// the patched tree, which adds the legacy and drainer modes. Everything that
// differs between the two builds lives in this package, behind the tag.
package readmode

import "errors"

// The read modes, named as compat.Mode names them.
const (
	Upstream = "upstream"
	Legacy   = "legacy"
	Drainer  = "drainer"
	// LegacyAutoDrain is legacy mode with its own drain loop
	// (LegacyOptions.AutoDrain). It is not one of the suite's variants:
	// a scenario dials it in place of Legacy where a case asks for it.
	LegacyAutoDrain = "legacy-autodrain"
	// DrainerBlocking is the drainer with its socket read by blocking
	// system calls (compat.WithBlockingRead): a variant of the drain and
	// the idle connections only.
	DrainerBlocking = "drainer-blocking"
)

// ErrUnsupported is returned for a mode this build does not have.
var ErrUnsupported = errors.New("readmode: this build does not offer that read mode")

// A BudgetSample is what ReadBudget reads from a drainer connection's
// Stats: its read budget, and the notifications waiting for its biggest
// NotifyPublish listener.
type BudgetSample struct {
	Limit, Used  int64  // bytes
	Paused       bool   // reading is paused for the budget
	Pauses       uint64 // how often reading paused
	PublishDepth int    // confirmations queued for the biggest NotifyPublish listener
}

// CoalesceEnv, set to 1 in a scenario's environment (the runner's
// drainer-coalesce and legacy-coalesce variants), turns on
// CoalescePublishes in the drainer and legacy modes of the patched build.
const CoalesceEnv = "BENCH_COALESCE_PUBLISHES"
