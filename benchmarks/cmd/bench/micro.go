package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// microResult is the broker-free micro-benchmarks (benchmarks/micro) of
// both builds: per benchmark (size=…) and variant, the median of B/op and
// allocs/op over -count runs.
type microResult struct {
	Command string                                   `json:"command"`
	Rows    map[string]map[string]map[string]float64 `json:"rows"` // benchmark, variant, unit
	Raw     map[string]string                        `json:"raw"`  // build: go test output
}

// runMicro runs the micro-benchmarks in both builds. They measure B/op
// and allocs/op of the client alone (the peer is in-process but its
// allocations are kept out of the timed loop); ns/op is printed too.
func runMicro(ctx context.Context, quick bool) (*microResult, error) {
	benchtime, count := "5000x", "3"
	if quick {
		benchtime, count = "200x", "1"
	}
	args := []string{"test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", benchtime, "-count", count}
	res := &microResult{
		Command: "go " + strings.Join(append(args, "./benchmarks/micro"), " "),
		Rows:    map[string]map[string]map[string]float64{},
		Raw:     map[string]string{},
	}
	builds := map[string][]string{
		"patched":  append(slices.Clone(args), "./benchmarks/micro"),
		"pristine": append(slices.Clone(args), "-modfile=go.upstream.mod", "-tags", "pristine", "./benchmarks/micro"),
	}
	samples := map[[3]string][]float64{}
	for _, build := range []string{"pristine", "patched"} {
		cmd := exec.CommandContext(ctx, "go", builds[build]...)
		if build == "pristine" {
			cmd.Env = append(os.Environ(), "GOWORK=off")
		}
		out, err := cmd.CombinedOutput()
		res.Raw[build] = string(out)
		if err != nil {
			return res, fmt.Errorf("micro-benchmarks (%s): %v\n%s", build, err, lastLine(string(out)))
		}
		r := benchfmt.NewReader(bytes.NewReader(out), build)
		for r.Scan() {
			b, ok := r.Result().(*benchfmt.Result)
			if !ok {
				continue
			}
			name, mode := splitMode(b.Name.String())
			variant := mode
			if build == "pristine" {
				variant = "pristine"
			}
			for _, v := range b.Values {
				if v.Unit == "B/op" || v.Unit == "allocs/op" || v.Unit == "sec/op" {
					k := [3]string{name, variant, v.Unit}
					samples[k] = append(samples[k], v.Value)
				}
			}
		}
		if err := r.Err(); err != nil {
			return res, err
		}
	}
	for k, vs := range samples {
		slices.Sort(vs)
		if res.Rows[k[0]] == nil {
			res.Rows[k[0]] = map[string]map[string]float64{}
		}
		if res.Rows[k[0]][k[1]] == nil {
			res.Rows[k[0]][k[1]] = map[string]float64{}
		}
		res.Rows[k[0]][k[1]][k[2]] = vs[len(vs)/2]
	}
	return res, nil
}

// splitMode cuts "Publish/size=4/mode=drainer-2" into "Publish/size=4" and
// "drainer", dropping the GOMAXPROCS suffix.
func splitMode(name string) (string, string) {
	i := strings.LastIndex(name, "/mode=")
	if i < 0 {
		return name, ""
	}
	mode := name[i+len("/mode="):]
	if j := strings.LastIndexByte(mode, '-'); j >= 0 {
		mode = mode[:j]
	}
	return name[:i], mode
}

// writeMicro appends the micro-benchmark table to the report.
func writeMicro(w func(string, ...any), m *microResult) {
	if m == nil || len(m.Rows) == 0 {
		return
	}
	w("## Micro-benchmarks: publish encoding and delivery decoding, no broker\n\n")
	w("`%s`, and the same with `-modfile=go.upstream.mod -tags pristine` for the pristine build; "+
		"median of the runs. Publish is one PublishWithContext of the seed's properties, its writes "+
		"discarded by the connection; Deliver is one basic.deliver with its content, read, parsed and "+
		"received from the Consume chan, from an in-process peer. Allocations are the whole process's.\n\n", m.Command)
	names := make([]string, 0, len(m.Rows))
	for n := range m.Rows {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return strings.Compare(sortKey(a), sortKey(b)) })
	variants := []string{"pristine", "upstream", "legacy", "drainer"}
	w("| benchmark | unit | %s |\n|---|---|---|---|---|---|\n", strings.Join(variants, " | "))
	for _, n := range names {
		for _, unit := range []string{"B/op", "allocs/op"} {
			w("| %s | %s |", n, unit)
			for _, v := range variants {
				if x, ok := m.Rows[n][v][unit]; ok {
					w(" %s |", formatMicro(x))
				} else {
					w(" — |")
				}
			}
			w("\n")
		}
	}
	w("\n")
}

// sortKey orders sizes numerically: size=4 before size=43 before size=512.
func sortKey(name string) string {
	base, size, ok := strings.Cut(name, "/size=")
	if !ok {
		return name
	}
	return fmt.Sprintf("%s/%08s", base, size)
}

func formatMicro(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}
