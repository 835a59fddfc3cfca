// Package backoff is the exponential retry delay shared by compat's
// DialCluster (between passes over its endpoints) and the failover
// package (between dials, channel reopens and re-consumes), written once
// so that both bound and randomise it the same way; each keeps its own
// defaults and its own share of jitter.
package backoff

import (
	"math"
	"math/rand/v2"
	"time"
)

// Jitter divisors for Exponential.Jitter.
const (
	// Full is "full jitter": the delay is uniform in [0, bound], which
	// spreads clients that failed together the most.
	Full = 1
	// Fifth takes up to a fifth off the bound: the delay stays close to
	// the bound, which keeps a retry schedule predictable.
	Fifth = 5
)

// Exponential is a delay whose bound is Initial after the first failure,
// doubled with each further failure up to Max, less a random part of up
// to bound/Jitter.
type Exponential struct {
	Initial, Max time.Duration
	// Jitter divides the bound into the part that is random: Full (1) or
	// Fifth (5). 0 means Full.
	Jitter int64
	// Rand returns a uniform number in [0, n), n > 0; nil is
	// math/rand/v2's Int64N. Tests set it to reach the ends of the range.
	Rand func(n int64) int64
}

// Bound is the delay after n failures (n ≥ 1) before its jitter:
// min(Max, Initial·2^(n-1)), without overflow however large n is.
func (e Exponential) Bound(n int) time.Duration {
	bound := e.Initial
	for i := 1; i < n && bound < e.Max; i++ {
		if bound > e.Max/2 {
			bound = e.Max
			break
		}
		bound *= 2
	}
	return min(bound, e.Max)
}

// Delay is the wait after n failures (n ≥ 1): uniform in
// [Bound(n) - Bound(n)/Jitter, Bound(n)], and 0 when the bound is not
// positive (no backoff).
func (e Exponential) Delay(n int) time.Duration {
	bound := e.Bound(n)
	if bound <= 0 {
		return 0
	}
	span := int64(bound) / max(e.Jitter, 1)
	r := e.Rand
	if r == nil {
		r = rand.Int64N
	}
	k := span
	if k < math.MaxInt64 {
		k++ // both ends of the range
	}
	return bound - time.Duration(span) + time.Duration(r(k))
}
