// Package hist records latencies in an HDR histogram and summarises them
// as the benchmark reports print them: P50, P95, P99 and max, in
// milliseconds, plus the points of the distribution for charts.
package hist

import (
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram bounds: 1 µs to 10 minutes at 3 significant digits, which
// covers a loopback publish and a 45-second upstream stall alike.
const (
	lowest  = int64(time.Microsecond)
	highest = int64(10 * time.Minute)
	digits  = 3
)

// A Recorder collects durations. It is safe for concurrent use.
type Recorder struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram
}

// New returns an empty Recorder.
func New() *Recorder {
	return &Recorder{h: hdrhistogram.New(lowest, highest, digits)}
}

// Record adds one duration. Durations outside the histogram's range are
// clamped to it rather than dropped, so that the count stays exact.
func (r *Recorder) Record(d time.Duration) {
	v := min(max(int64(d), lowest), highest)
	r.mu.Lock()
	_ = r.h.RecordValue(v) // cannot fail: v is in range
	r.mu.Unlock()
}

// Merge adds every value of o to r.
func (r *Recorder) Merge(o *Recorder) {
	o.mu.Lock()
	snap := hdrhistogram.Import(o.h.Export())
	o.mu.Unlock()
	r.mu.Lock()
	r.h.Merge(snap)
	r.mu.Unlock()
}

// A Summary describes a distribution in milliseconds.
type Summary struct {
	N      int64   `json:"n"`
	P50    float64 `json:"p50_ms"`
	P95    float64 `json:"p95_ms"`
	P99    float64 `json:"p99_ms"`
	Max    float64 `json:"max_ms"`
	Mean   float64 `json:"mean_ms"`
	Points []Point `json:"points,omitempty"`
}

// A Point is one percentile of a distribution, for charts.
type Point struct {
	Percentile float64 `json:"percentile"`
	Millis     float64 `json:"ms"`
}

// chartPercentiles are the points a Summary keeps.
var chartPercentiles = []float64{0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.99, 100}

// Summary summarises what r has recorded.
func (r *Recorder) Summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Summary{N: r.h.TotalCount()}
	if s.N == 0 {
		return s
	}
	ms := func(v int64) float64 { return float64(v) / float64(time.Millisecond) }
	s.P50 = ms(r.h.ValueAtQuantile(50))
	s.P95 = ms(r.h.ValueAtQuantile(95))
	s.P99 = ms(r.h.ValueAtQuantile(99))
	s.Max = ms(r.h.Max())
	s.Mean = r.h.Mean() / float64(time.Millisecond)
	for _, p := range chartPercentiles {
		v := r.h.ValueAtQuantile(p)
		if p == 100 {
			v = r.h.Max()
		}
		s.Points = append(s.Points, Point{Percentile: p, Millis: ms(v)})
	}
	return s
}
