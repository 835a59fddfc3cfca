package otelamqp

import (
	"os"
	"strings"
	"testing"
)

// TestVersionFollowsThePin keeps the instrumentation scope's version the
// pinned amqp091-go release (scripts/rebase rewrites both).
func TestVersionFollowsThePin(t *testing.T) {
	pin, err := os.ReadFile("../upstream/PIN")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(pin))
	if len(fields) != 3 {
		t.Fatalf("upstream/PIN: %q", pin)
	}
	if want := strings.TrimPrefix(fields[1], "v"); Version() != want {
		t.Fatalf("Version() = %q, the pinned release is %s", Version(), fields[1])
	}
}
