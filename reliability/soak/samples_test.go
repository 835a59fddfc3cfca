package soak

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// A sample is the process's state at one moment of the soak.
type sample struct {
	at         time.Duration
	heap       uint64 // HeapAlloc right after a GC: the live heap
	inuse      uint64 // HeapInuse: spans in use, fragmentation included
	goroutines int

	published, acked, consumed int
	resets                     int
	losses                     int64
	chans                      int64 // channels the churner opened so far
}

// take samples the process. The GC first makes HeapAlloc the live heap,
// not whatever garbage the last cycle left.
func take(at time.Duration, fill func(*sample)) sample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := sample{at: at, heap: ms.HeapAlloc, inuse: ms.HeapInuse, goroutines: runtime.NumGoroutine()}
	if fill != nil {
		fill(&s)
	}
	return s
}

const header = "    time  heap MiB  inuse MiB  goroutines  published    acked  consumed  resets  losses  channels"

func (s sample) String() string {
	return fmt.Sprintf("%8s  %8.1f  %9.1f  %10d  %9d  %7d  %8d  %6d  %6d  %8d",
		s.at.Round(time.Second), mib(s.heap), mib(s.inuse), s.goroutines,
		s.published, s.acked, s.consumed, s.resets, s.losses, s.chans)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// thirds splits the samples into three runs of (nearly) equal length; the
// samples are evenly spaced in time, so these are thirds of the soak.
func thirds(s []sample) (first, middle, last []sample) {
	n := len(s) / 3
	return s[:n], s[n : len(s)-n], s[len(s)-n:]
}

func peak(s []sample, f func(sample) float64) float64 {
	m := 0.0
	for _, x := range s {
		m = max(m, f(x))
	}
	return m
}

var (
	heapMiB    = func(s sample) float64 { return mib(s.heap) }
	goroutines = func(s sample) float64 { return float64(s.goroutines) }
)

// The level-off allowances; see levelOff.
const (
	heapFactor, heapSlackMiB = 1.5, 2.0
	goFactor, goSlack        = 1.25, 10.0
	minSamples               = 9
)

// levelOff returns why the heap or the goroutine count has not levelled
// off, if it has not.
//
// The criterion: the peak over the last third of the soak may exceed the
// peak over the middle third by at most a factor and a slack. The first
// third is warm-up (the ledger's first growth, pools and buffers reaching
// their working size) and is left out. A leak grows with time, or with
// the number of faults, which arrive uniformly; either way it lifts the
// last third's peak above the middle third's. A steady state only
// oscillates, and two windows of equal length see the same peaks up to
// noise: GC timing, a sample that catches every connection mid-redial.
//
// The allowances are generous on purpose, so that the test does not flake
// on two shared cores: the live heap may grow 50% plus 2 MiB (the slack
// because one buffer is a large fraction of a live heap under 1 MiB),
// goroutines 25% plus 10. Each fault costs the five workers a connection
// each, about 100 lost connections in a third of the full soak: a leak of
// one goroutine, or of 20 KiB, per lost connection fails.
func levelOff(s []sample) []string {
	if len(s) < minSamples {
		return []string{fmt.Sprintf("only %d samples, want at least %d to judge a trend: run longer", len(s), minSamples)}
	}
	_, middle, last := thirds(s)
	var p []string
	if m, l := peak(middle, heapMiB), peak(last, heapMiB); l > m*heapFactor+heapSlackMiB {
		p = append(p, fmt.Sprintf("the live heap kept growing: peak %.1f MiB in the last third, %.1f MiB in the middle third (allowed %.1f)",
			l, m, m*heapFactor+heapSlackMiB))
	}
	if m, l := peak(middle, goroutines), peak(last, goroutines); l > m*goFactor+goSlack {
		p = append(p, fmt.Sprintf("goroutines kept growing: peak %.0f in the last third, %.0f in the middle third (allowed %.0f)",
			l, m, m*goFactor+goSlack))
	}
	return p
}

// progress returns which kind of work stalled in the last third of the
// soak, if any did: publishing, consuming or channel churn. A worker stuck
// for good (a recovery that never ends, a confirmation that never comes)
// shows there even when nothing grows.
func progress(s []sample) []string {
	if len(s) < minSamples {
		return nil // levelOff says so
	}
	_, _, last := thirds(s)
	a, b := last[0], last[len(last)-1]
	var p []string
	for _, w := range []struct {
		what       string
		from, upto int64
	}{
		{"publishing", int64(a.acked), int64(b.acked)},
		{"consuming", int64(a.consumed), int64(b.consumed)},
		{"channel churn", a.chans, b.chans},
	} {
		if w.upto <= w.from {
			p = append(p, fmt.Sprintf("%s stalled in the last third of the soak (%d at %v, %d at %v)", w.what, w.from, a.at.Round(time.Second), w.upto, b.at.Round(time.Second)))
		}
	}
	return p
}

// summarize logs the peaks of each third, the table's gist.
func summarize(t *testing.T, s []sample) {
	t.Helper()
	if len(s) < 3 {
		return
	}
	first, middle, last := thirds(s)
	t.Logf("peaks by third (start / middle / end): heap %.1f / %.1f / %.1f MiB, goroutines %.0f / %.0f / %.0f",
		peak(first, heapMiB), peak(middle, heapMiB), peak(last, heapMiB),
		peak(first, goroutines), peak(middle, goroutines), peak(last, goroutines))
}
