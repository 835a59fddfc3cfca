package compat

import (
	"testing"
	"time"
)

// TestBackoffFullJitter: DialCluster's bound doubles per failed pass from
// initial up to max, and the delay is uniform in [0, bound].
func TestBackoffFullJitter(t *testing.T) {
	var asked []int64
	cl := cluster{backoffInitial: 100 * time.Millisecond, backoffMax: 5 * time.Second}
	top := cl.passBackoff()
	top.Rand = func(n int64) int64 { asked = append(asked, n); return n - 1 }
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for pass, w := range want {
		if got := top.Delay(pass + 1); got != w*time.Millisecond {
			t.Fatalf("pass %d: delay %v at the top of the range, want %v", pass+1, got, w*time.Millisecond)
		}
	}
	if asked[0] != int64(100*time.Millisecond)+1 {
		t.Fatalf("asked rand for [0, %d), want [0, 100ms]", asked[0])
	}
	bottom := cl.passBackoff()
	bottom.Rand = func(n int64) int64 { return 0 }
	if got := bottom.Delay(3); got != 0 {
		t.Fatalf("full jitter's bottom: %v, want 0", got)
	}
	if got := (&cluster{backoffMax: time.Second}).passBackoff().Delay(4); got != 0 {
		t.Fatalf("no backoff: %v", got)
	}
	huge := (&cluster{backoffInitial: time.Second, backoffMax: time.Hour}).passBackoff()
	huge.Rand = func(n int64) int64 { return n - 1 }
	if got := huge.Delay(1000); got != time.Hour {
		t.Fatalf("pass 1000: %v, want the cap (no overflow)", got)
	}
}
