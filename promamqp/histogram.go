package promamqp

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultBuckets are the upper bounds, in seconds, of every latency
// histogram unless WithBuckets says otherwise. They start at 100µs rather
// than at prometheus.DefBuckets' 5ms because a confirm or an RPC on a
// nearby broker takes well under a millisecond: DefBuckets would put
// nearly every observation into its first bucket and hide the
// regressions that matter. They end at 10s, past which a stuck broker is
// already visible in the error and pause counters.
var DefaultBuckets = []float64{
	0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005,
	0.01, 0.025, 0.05,
	0.1, 0.25, 0.5,
	1, 2.5, 5, 10,
}

// buckets is a validated set of histogram bounds, shared by every
// histogram of a Collector.
type buckets struct {
	seconds []float64 // the upper bounds as exposed
	nanos   []int64   // the same bounds in nanoseconds, compared on the hot path
}

// newBuckets checks and converts upper bounds given in seconds. It panics
// on bounds that are not positive, finite and strictly increasing, as
// prometheus.NewHistogram does, because such bounds are a programming
// error best reported at New rather than as a broken scrape.
func newBuckets(seconds []float64) buckets {
	if len(seconds) == 0 {
		panic("promamqp: no histogram buckets")
	}
	b := buckets{
		seconds: append([]float64(nil), seconds...),
		nanos:   make([]int64, len(seconds)),
	}
	for i, s := range seconds {
		if !(s > 0) || math.IsInf(s, 0) {
			panic(fmt.Sprintf("promamqp: histogram bucket %v is not a positive finite number of seconds", s))
		}
		if i > 0 && s <= seconds[i-1] {
			panic(fmt.Sprintf("promamqp: histogram buckets are not strictly increasing: %v after %v", s, seconds[i-1]))
		}
		b.nanos[i] = int64(math.Round(s * 1e9))
	}
	return b
}

// histogram is a fixed-bucket histogram of durations that the Observer's
// funcs update with two atomic adds and no lock, so that a publisher, a
// dispatcher and the reader observing at once never wait for one another
// or for a scrape. Collect turns it into a const histogram.
//
// A scrape reads the buckets and the sum one after the other, not as one
// snapshot, so an observation that lands meanwhile may be in the count
// and not yet in the sum. That skew is one observation per concurrent
// event, gone at the next scrape; rate() over the series is unaffected.
type histogram struct {
	b      *buckets
	counts []atomic.Uint64 // counts[i]: observations in (nanos[i-1], nanos[i]]; the last: above every bound
	sum    atomic.Int64    // nanoseconds: integer adds need no compare-and-swap loop
}

func newHistogram(b *buckets) *histogram {
	return &histogram{b: b, counts: make([]atomic.Uint64, len(b.nanos)+1)}
}

// observe records one duration. Negative durations (a clock stepping
// back) count as zero rather than subtracting from the sum.
func (h *histogram) observe(d time.Duration) {
	n := int64(d)
	if n < 0 {
		n = 0
	}
	// A linear scan: with a dozen or so bounds it beats a binary search,
	// and most observations stop within the first few.
	i := 0
	for i < len(h.b.nanos) && n > h.b.nanos[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(n)
}

// count is the number of observations so far.
func (h *histogram) count() uint64 {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}

// metric returns the histogram as a const metric with desc and the label
// values given.
func (h *histogram) metric(desc *prometheus.Desc, labelValues ...string) prometheus.Metric {
	cumulative := make(map[float64]uint64, len(h.b.seconds))
	var n uint64
	for i, le := range h.b.seconds {
		n += h.counts[i].Load()
		cumulative[le] = n
	}
	n += h.counts[len(h.b.seconds)].Load()
	sum := time.Duration(h.sum.Load()).Seconds()
	return prometheus.MustNewConstHistogram(desc, n, sum, cumulative, labelValues...)
}
