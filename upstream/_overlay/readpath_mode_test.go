// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"fmt"
	"os"
)

// testReadModeEnv forces a read mode on every connection that this package's
// tests open through Open or Dial* without a Config.ReadPath, so that
// upstream's own suite runs unchanged against another read path. Only this
// test file reads it: production builds never look at the environment.
const testReadModeEnv = "AMQP091_DRAINER_TEST_READ_MODE"

func init() {
	switch mode := os.Getenv(testReadModeEnv); mode {
	case "", "upstream":
		defaultReadPath = nil
	case "seam-probe":
		defaultReadPath = seamProbe{}
	case "drainer":
		defaultReadPath = Drainer(DrainerOptions{})
	default:
		panic(fmt.Sprintf("%s=%q: want one of upstream, seam-probe, drainer", testReadModeEnv, mode))
	}
}
