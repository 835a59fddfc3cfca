// Command overhead measures what observing the publish and the consume
// paths costs. It publishes with confirms, and drains a queue filled
// beforehand, over drainer-mode connections with no Observer (none), with
// one whose funcs do nothing (noop) and with otelamqp's over a real SDK
// (otel), alternating the variants round by round so that a drift of the
// machine or the broker spreads over all three, and prints their
// throughput and allocations against "none".
//
//	go run ./cmd/overhead -n 20000 -rounds 5 -size 64
//	go run ./cmd/overhead -markdown >> BENCHMARKS.md
//
// The broker is AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp/internal/overhead"
)

// target is how far the noop variant's P50 may be from none's: calling
// hooks that do nothing should cost next to nothing next to a publish or
// a delivery. It bounds both ways: a noop much faster than none cannot be
// the hooks' doing, only noise, and a run that noisy cannot show the
// overhead small either.
const target = 0.05

type result struct {
	rates  []float64 // msg/s, one per round
	allocs []float64 // allocations per message, one per round
}

// path is one of the paths measured, with how.
type path struct {
	name  string // "publish", "consume"
	about string // how it is measured, for the report
	// measure runs n messages through the path in variant v and returns
	// their rate and the allocations per message.
	measure func(ctx context.Context, url string, v overhead.Variant, n, size int) (rate, allocs float64, err error)
}

var paths = []path{
	{
		name: "publish",
		about: "PublishWithContext in confirm mode to amq.direct with a key no queue is bound to, the confirms read as they come;" +
			" timed over the -n publishes after a warm-up",
		measure: measurePublish,
	},
	{
		name: "consume",
		about: fmt.Sprintf("Channel.Consume from an exclusive server-named queue filled beforehand over an unobserved connection,"+
			" prefetch %d, manual ack with multiple every %d; timed over the -n deliveries after a warm-up and before a tail of %d",
			overhead.Prefetch, overhead.AckEvery, overhead.Prefetch),
		measure: measureConsume,
	},
}

// options are the flags a run was made with, the URL aside: it may hold
// credentials, and says nothing of the figures.
type options struct {
	n, rounds, size int
	markdown        bool
}

// String returns the flags as they would be typed.
func (o options) String() string {
	return fmt.Sprintf("-n %d -rounds %d -size %d", o.n, o.rounds, o.size)
}

func main() {
	var o options
	flag.IntVar(&o.n, "n", 20000, "messages per variant, path and round")
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; each runs every variant once on each path")
	flag.IntVar(&o.size, "size", 64, "body size in bytes")
	flag.BoolVar(&o.markdown, "markdown", false, `print a Markdown section ("## Observer overhead") for BENCHMARKS.md instead of a text table`)
	url := flag.String("url", "", "broker URL (default: AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/)")
	flag.Parse()
	if o.n <= 0 || o.rounds <= 0 || o.size < 0 {
		fmt.Fprintln(os.Stderr, "overhead: -n and -rounds must be positive, -size not negative")
		os.Exit(2)
	}
	if *url == "" {
		*url = os.Getenv("AMQP_URL")
	}
	if *url == "" {
		*url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(*url, o); err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		os.Exit(1)
	}
}

func run(url string, o options) error {
	variants := overhead.Variants()
	results := make([][]result, len(paths))
	for p := range paths {
		results[p] = make([]result, len(variants))
	}
	ctx := context.Background()
	for r := 0; r < o.rounds; r++ {
		for p, pa := range paths {
			// Rotate the order each round: the first variant of a round
			// runs on a broker that has just rested, the last on one that
			// has not.
			for k := range variants {
				i := (r + k) % len(variants)
				rate, allocs, err := pa.measure(ctx, url, variants[i], o.n, o.size)
				if err != nil {
					return fmt.Errorf("round %d, %s, %s: %w", r+1, pa.name, variants[i].Name, err)
				}
				results[p][i].rates = append(results[p][i].rates, rate)
				results[p][i].allocs = append(results[p][i].allocs, allocs)
				fmt.Fprintf(os.Stderr, "round %d %-7s %-4s %10.0f msg/s %6.1f allocs/msg\n",
					r+1, pa.name, variants[i].Name, rate, allocs)
			}
		}
	}

	sums := make([]summary, len(paths))
	for p := range paths {
		sums[p] = summarize(paths[p], variants, results[p])
	}
	if o.markdown {
		return writeMarkdown(os.Stdout, o, sums)
	}
	return writeText(os.Stdout, o, sums)
}

// warmup is how many messages a measure runs before its window, so that
// the connection's buffers and the SDK's caches are in place.
func warmup(n int) int {
	return min(n/10, 2000)
}

// measurePublish publishes n messages in a variant and returns its rate
// and the allocations per message of the whole process meanwhile (the
// drainer's goroutines included: they are part of what a publish costs).
func measurePublish(ctx context.Context, url string, v overhead.Variant, n, size int) (rate, allocs float64, err error) {
	p, err := overhead.Dial(url, v, size)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, p.Close()) }()
	if err := p.Publish(ctx, warmup(n)); err != nil {
		return 0, 0, err
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	if err := p.Publish(ctx, n); err != nil {
		return 0, 0, err
	}
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	return float64(n) / took.Seconds(), float64(after.Mallocs-before.Mallocs) / float64(n), nil
}

// measureConsume drains n messages in a variant, from a queue that an
// unobserved connection filled first, and returns its rate and the
// allocations per message of the whole process meanwhile (the drainer's
// goroutine included, where the Observer's Delivered runs).
//
// The window holds the n deliveries after a warm-up and before a tail of
// Prefetch more: it opens as the last warm-up delivery arrives and closes
// as the n-th after it does, so it counts exactly n. Timed from the very
// first delivery to the very last instead, it would miss the read path's
// work on the deliveries it had decoded ahead (up to Prefetch) before the
// clock started, and the Observer's cost with it; mid-stream, the
// deliveries decoded ahead at the start are matched by those at the end.
func measureConsume(ctx context.Context, url string, v overhead.Variant, n, size int) (rate, allocs float64, err error) {
	c, err := overhead.DialConsumer(url, v)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	warm := max(warmup(n), 1) // at least one: the window opens on it
	total := warm + n + overhead.Prefetch
	if err := overhead.Fill(ctx, url, c.Queue(), total, size); err != nil {
		return 0, 0, fmt.Errorf("filling the queue: %w", err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	var start time.Time
	var took time.Duration
	open, last := warm-1, warm+n-1
	// ReadMemStats stops the world: read before the clock starts and
	// after it stops, as the publish side does.
	mark := func(i int) {
		switch i {
		case open:
			runtime.ReadMemStats(&before)
			start = time.Now()
		case last:
			took = time.Since(start)
			runtime.ReadMemStats(&after)
		}
	}
	if err := c.Drain(ctx, total, mark); err != nil {
		return 0, 0, err
	}
	return float64(n) / took.Seconds(), float64(after.Mallocs-before.Mallocs) / float64(n), nil
}

// row is one variant's figures on one path.
type row struct {
	variant            string
	p50, p95, p99, max float64 // msg/s over the rounds
	allocs             float64 // allocations per message, median over the rounds
	vsNone             float64 // p50 over none's p50
}

// summary is one path's rows, "none" first, and how noop fares against
// the target.
type summary struct {
	path path
	rows []row
	noop float64 // noop's P50 over none's P50
}

func summarize(pa path, variants []overhead.Variant, res []result) summary {
	s := summary{path: pa}
	base := percentile(res[0].rates, 50)
	for i, v := range variants {
		r := res[i]
		s.rows = append(s.rows, row{
			variant: v.Name,
			p50:     percentile(r.rates, 50),
			p95:     percentile(r.rates, 95),
			p99:     percentile(r.rates, 99),
			max:     percentile(r.rates, 100),
			allocs:  median(r.allocs),
			vsNone:  percentile(r.rates, 50) / base,
		})
		if v.Name == "noop" {
			s.noop = s.rows[i].vsNone
		}
	}
	return s
}

// verdict is the target line, the same in either output so that a script
// can look for it.
func (s summary) verdict() string {
	met := "met"
	switch {
	case s.noop < 1-target:
		met = "missed"
	case s.noop > 1+target:
		// Hooks that do nothing cannot make it faster: the run's noise is
		// larger than the target, so it shows nothing either way.
		met = "inconclusive: noop faster than none by more than the target, which is this run's noise"
	}
	return fmt.Sprintf("noop within %.0f %% of none (P50 msg/s): %s (%+.1f %%)", target*100, met, (s.noop-1)*100)
}

// header says what was measured, for both outputs.
func header(o options) string {
	return fmt.Sprintf("%d messages of %d bytes per variant, path and round, %s, drainer mode, GOMAXPROCS=%d, %s",
		o.n, o.size, plural(o.rounds, "round"), runtime.GOMAXPROCS(0), runtime.Version())
}

// percentileNote says how to read P95 and P99 with few rounds.
func percentileNote(o options) string {
	return fmt.Sprintf("msg/s percentiles are nearest-rank over the %s:"+
		" with fewer than 20 rounds P95 is the max, with fewer than 100 P99 is.", plural(o.rounds, "per-round rate"))
}

func writeText(out io.Writer, o options, sums []summary) error {
	fmt.Fprintf(out, "\n%s\n", header(o))
	for _, s := range sums {
		fmt.Fprintf(out, "%s: %s\n", s.path.name, s.path.about)
	}
	for _, s := range sums {
		fmt.Fprintf(out, "\n%s\n", s.path.name)
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(w, "variant\tmsg/s P50\tmsg/s P95\tmsg/s P99\tmsg/s max\tallocs/msg\tP50 vs none\t")
		for _, r := range s.rows {
			fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.3f\t\n",
				r.variant, r.p50, r.p95, r.p99, r.max, r.allocs, r.vsNone)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(out, s.verdict())
	}
	_, err := fmt.Fprintf(out, "\n%s\n", percentileNote(o))
	return err
}

// writeMarkdown prints a section to append to BENCHMARKS.md. It starts
// with a blank line, so that the heading stands apart from whatever the
// file ends with.
func writeMarkdown(out io.Writer, o options, sums []summary) error {
	fmt.Fprintf(out, "\n## Observer overhead\n\n")
	fmt.Fprintf(out, "Generated by `go run ./cmd/overhead %s -markdown` (otelamqp/cmd/overhead): %s."+
		" Variants, alternated round by round: **none** (no Observer), **noop** (every func does nothing),"+
		" **otel** (otelamqp's Observer on a real SDK with no exporter).\n", o, header(o))
	for _, s := range sums {
		fmt.Fprintf(out, "\n### %s\n\n", upperFirst(s.path.name))
		fmt.Fprintf(out, "%s.\n\n", upperFirst(s.path.about))
		fmt.Fprintln(out, "| variant | msg/s P50 | msg/s P95 | msg/s P99 | msg/s max | allocs/msg | P50 vs none |")
		fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|")
		for _, r := range s.rows {
			fmt.Fprintf(out, "| %s | %.0f | %.0f | %.0f | %.0f | %.1f | %.3f |\n",
				r.variant, r.p50, r.p95, r.p99, r.max, r.allocs, r.vsNone)
		}
		fmt.Fprintf(out, "\n%s\n", s.verdict())
	}
	_, err := fmt.Fprintf(out, "\n%s\n", percentileNote(o))
	return err
}

// plural returns "1 round" or "5 rounds".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// upperFirst capitalizes an ASCII first letter, for a sentence or a
// heading made of a lower-case phrase.
func upperFirst(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}

// percentile returns the p-th percentile of xs by nearest rank: the
// smallest x with at least p % of xs at or below it, so always one of the
// rounds' own figures. With few rounds the high ones are the max: P95 is
// the max of fewer than 20 rounds, P99 of fewer than 100.
func percentile(xs []float64, p int) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	rank := (p*len(s) + 99) / 100 // ⌈p·n/100⌉, in integers: 0.95·20 is not 19 in floats
	return s[max(rank, 1)-1]
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := len(s) / 2
	if len(s)%2 == 0 {
		return (s[m-1] + s[m]) / 2
	}
	return s[m]
}
