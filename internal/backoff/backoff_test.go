package backoff

import (
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The bound doubles per failure from Initial up to Max, without overflow.
func TestBound(t *testing.T) {
	e := Exponential{Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i, w := range want {
		if got := e.Bound(i + 1); got != w*time.Millisecond {
			t.Fatalf("failure %d: bound %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	huge := Exponential{Initial: time.Second, Max: math.MaxInt64}
	if got := huge.Bound(1000); got != math.MaxInt64 {
		t.Fatalf("failure 1000 under the largest Max: %v, want the cap (no overflow)", got)
	}
}

// Full jitter is uniform in [0, bound]; Fifth in [bound - bound/5, bound].
func TestDelayJitter(t *testing.T) {
	top := func(n int64) int64 { return n - 1 }
	bottom := func(int64) int64 { return 0 }
	const ms = time.Millisecond
	for _, tc := range []struct {
		name      string
		e         Exponential
		n         int
		low, high time.Duration
	}{
		{"full", Exponential{Initial: 100 * ms, Max: 5000 * ms, Jitter: Full}, 3, 0, 400 * ms},
		{"zero Jitter is full", Exponential{Initial: 100 * ms, Max: 5000 * ms}, 3, 0, 400 * ms},
		{"fifth", Exponential{Initial: 100 * ms, Max: 5000 * ms, Jitter: Fifth}, 3, 320 * ms, 400 * ms},
		{"fifth at the cap", Exponential{Initial: 100 * ms, Max: 5000 * ms, Jitter: Fifth}, 40, 4000 * ms, 5000 * ms},
		{"largest bound", Exponential{Initial: math.MaxInt64, Max: math.MaxInt64}, 2, 0, math.MaxInt64 - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.e.Rand = bottom
			if got := tc.e.Delay(tc.n); got != tc.low {
				t.Errorf("bottom of the range: %v, want %v", got, tc.low)
			}
			tc.e.Rand = top
			if got := tc.e.Delay(tc.n); got != tc.high {
				t.Errorf("top of the range: %v, want %v", got, tc.high)
			}
			tc.e.Rand = nil
			for range 100 {
				if got := tc.e.Delay(tc.n); got < tc.low || got > tc.high {
					t.Fatalf("math/rand: %v, outside [%v, %v]", got, tc.low, tc.high)
				}
			}
		})
	}
	if got := (Exponential{Max: time.Second}).Delay(4); got != 0 {
		t.Fatalf("Initial 0, no backoff: %v", got)
	}
}
