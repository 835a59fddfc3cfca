package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBenchName(t *testing.T) {
	for in, want := range map[[2]string]string{
		{"stalled-consumer", ""}:           "BenchmarkStalledConsumer",
		{"throughput", "publishers=10"}:    "BenchmarkThroughput/publishers=10",
		{"allocations", "pubsub size=512"}: "BenchmarkAllocations/pubsub_size=512",
	} {
		if got := benchName(in[0], in[1]); got != want {
			t.Errorf("benchName(%q, %q) = %q, want %q", in[0], in[1], got, want)
		}
	}
}

func TestVariantFilters(t *testing.T) {
	names := func(vs []scenario.Variant) (out []string) {
		for _, v := range vs {
			out = append(out, v.Name)
		}
		return out
	}
	if got := names(variantsFor(nil, "", false, false)); len(got) != 4 {
		t.Errorf("all variants: %v", got)
	}
	if got := names(variantsFor([]string{"drainer", "upstream"}, "", false, false)); len(got) != 3 || got[2] != "drainer" {
		t.Errorf("modes drainer+upstream: %v, want pristine, upstream, drainer", got)
	}
	if got := names(variantsFor(nil, "legacy,drainer", false, false)); len(got) != 2 {
		t.Errorf("-variants legacy,drainer: %v", got)
	}
	if got := names(variantsFor(nil, "drainer,pristine", true, false)); fmt.Sprint(got) != "[pristine drainer drainer-old]" {
		t.Errorf("with a baseline: %v, want [pristine drainer drainer-old]", got)
	}
	if got := names(abVariants(scenario.Variants, "legacy")); len(got) != 2 || got[0] != "pristine" || got[1] != "legacy" {
		t.Errorf("ab legacy: %v", got)
	}
	// The references run only where a scenario names them, and no
	// -variants filter that leaves them out brings them back.
	withRefs := []string{"upstream", "drainer", scenario.GoFloor, scenario.CClient}
	if got := names(variantsFor(withRefs, "", false, false)); fmt.Sprint(got) != "[pristine upstream drainer go-floor c-client]" {
		t.Errorf("a scenario naming the references: %v", got)
	}
	if got := names(variantsFor(withRefs, "pristine,drainer", true, false)); fmt.Sprint(got) != "[pristine drainer drainer-old]" {
		t.Errorf("references filtered out: %v", got)
	}
}

func TestFormatStat(t *testing.T) {
	if got := formatStat(scenario.Stat{}, false, 1); got != "—" {
		t.Errorf("unmeasured: %q", got)
	}
	if got := formatStat(scenario.Stat{Min: 1, Median: 2, Max: 3, N: 3}, true, 1); got != "2.0 (1.0–3.0)" {
		t.Errorf("spread: %q", got)
	}
	if got := formatStat(scenario.Stat{Min: 2, Median: 2, Max: 2, N: 3}, true, 0); got != "2" {
		t.Errorf("agreeing reps: %q", got)
	}
}

func TestFileName(t *testing.T) {
	if got := fileName("allocations", "pubsub size=512", "publish"); got != "allocations_pubsub-size-512_publish" {
		t.Errorf("fileName = %q", got)
	}
}

func TestSplitMode(t *testing.T) {
	if n, m := splitMode("Publish/size=4/mode=drainer-2"); n != "Publish/size=4" || m != "drainer" {
		t.Errorf("splitMode = %q, %q", n, m)
	}
	if sortKey("Deliver/size=43") >= sortKey("Deliver/size=512") {
		t.Error("size=43 must sort before size=512")
	}
}

// The 5pmL section judges the client's share after the broker's last
// nack, from the repetitions that had nacks.
func TestWriteFailoverClientShare(t *testing.T) {
	sum := func(p50, max float64, n int64) hist.Summary { return hist.Summary{N: n, P50: p50, Max: max} }
	f := &failoverResult{
		Reps:       3,
		Faults:     map[string]string{"5pmL": "the leader's node cut"},
		Targets:    map[string]time.Duration{"5pmL": 7750 * time.Millisecond},
		Resume:     map[string]map[string]hist.Summary{"5pmL": {"upstream": sum(32000, 32100, 3), "drainer": sum(8100, 11100, 3), "legacy": sum(8000, 11100, 3)}},
		Gap:        map[string]map[string]hist.Summary{"5pmL": {"upstream": sum(32000, 32000, 3), "drainer": sum(8100, 11100, 3), "legacy": sum(8000, 11100, 3)}},
		AfterNack:  map[string]map[string]hist.Summary{"5pmL": {"drainer": sum(550, 565, 3), "legacy": sum(510, 1200, 2)}},
		NotResumed: map[string]map[string]int{"5pmL": {}},
		Lost:       map[string]map[string]int{"5pmL": {}},
	}
	var b strings.Builder
	writeFailover(func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }, f)
	for _, want := range []string{
		"- drainer resumed 550 ms (P50) / 565 ms (max) after the broker's last nack; target, within 1s in every repetition with nacks (3 of 3): **met**",
		"- legacy resumed 510 ms (P50) / 1200 ms (max) after the broker's last nack; target, within 1s in every repetition with nacks (2 of 3): **not met**",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the section lacks %q:\n%s", want, b.String())
		}
	}
}
