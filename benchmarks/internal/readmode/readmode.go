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
)

// ErrUnsupported is returned for a mode this build does not have.
var ErrUnsupported = errors.New("readmode: this build does not offer that read mode")
