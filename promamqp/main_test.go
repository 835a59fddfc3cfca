package promamqp_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves a goroutine behind: a
// connection the broker test forgot to close, or a reader or dispatcher
// that outlived Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
