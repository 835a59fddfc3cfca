// Package level says how much of the reliability suite runs: nothing under
// a plain go test ./..., short bounded versions under make test, and the
// full versions under make reliability. The suites share one broker and
// some of them (the memory alarm) stop every publisher on it, so they must
// not run beside other packages' tests; scripts/reliability runs them one
// package at a time and sets EnvVar.
package level

import (
	"fmt"
	"os"
	"testing"
)

// Level is how much of the reliability suite runs.
type Level int

// The levels, in increasing order of run time.
const (
	Off   Level = iota // skipped: a plain go test ./...
	Short              // make test: bounded, a few minutes for the whole suite
	Full               // make reliability: the full versions
)

// EnvVar selects the level: "short" or "full". Unset or empty is Off.
const EnvVar = "AMQP091_RELIABILITY"

// Get returns the level EnvVar selects, or an error for a value it does
// not know.
func Get() (Level, error) {
	switch v := os.Getenv(EnvVar); v {
	case "", "off":
		return Off, nil
	case "short":
		return Short, nil
	case "full":
		return Full, nil
	default:
		return Off, fmt.Errorf("%s=%q: want short or full", EnvVar, v)
	}
}

// Require skips tb unless the suite is enabled, fails it for a bad value,
// and returns the level.
func Require(tb testing.TB) Level {
	tb.Helper()
	l, err := Get()
	if err != nil {
		tb.Fatal(err)
	}
	if l == Off {
		tb.Skipf("the reliability suite runs through scripts/reliability (make test runs it short, make reliability full), or with %s=short|full and go test -p 1", EnvVar)
	}
	return l
}

// Pick returns short at the Short level and full at the Full level.
func Pick[T any](l Level, short, full T) T {
	if l == Full {
		return full
	}
	return short
}
