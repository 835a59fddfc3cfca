// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"fmt"
	"os"
)

// testReadModeEnv forces a read mode on every connection that this package's
// tests open through Open or Dial* without a Config.ReadPath, so that
// upstream's own suite runs unchanged against another read path. Only this
// test file reads it.
//
// Set (even to "upstream"), it takes precedence over AMQP091_READ_MODE,
// the production switch (readmode.go), so a variable left in the shell
// cannot change what the suite runs in; SetDefaultReadPath, which only
// this package's own tests call, still comes first. Unset, the production
// order applies unchanged: AMQP091_READ_MODE, then upstream.
const testReadModeEnv = "AMQP091_DRAINER_TEST_READ_MODE"

func init() {
	mode, set := os.LookupEnv(testReadModeEnv)
	if !set || mode == "" {
		return
	}
	defaultReadPathForced = true
	switch mode {
	case "upstream":
		defaultReadPath = nil
	case "seam-probe":
		defaultReadPath = seamProbe{}
	case "drainer":
		defaultReadPath = Drainer(DrainerOptions{})
	case "legacy":
		defaultReadPath = Legacy(LegacyOptions{})
	case "legacy-autodrain":
		// The production option (autodrain.go): upstream's tests expect
		// deliveries, confirms and notifications to arrive without anyone
		// draining, so this is the legacy variant that runs most of them.
		defaultReadPath = Legacy(LegacyOptions{AutoDrain: true})
	default:
		panic(fmt.Sprintf("%s=%q: want one of upstream, seam-probe, drainer, legacy, legacy-autodrain", testReadModeEnv, mode))
	}
}
