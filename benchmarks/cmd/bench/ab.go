package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
)

// abVariants keeps, of the variants a scenario runs in, the pristine build
// and the patched build in mode.
func abVariants(vs []scenario.Variant, mode string) []scenario.Variant {
	var out []scenario.Variant
	for _, v := range vs {
		if (v.Build == "pristine" && !v.Reference) || v.Mode == mode {
			out = append(out, v)
		}
	}
	return out
}

// abCompare writes each build's runs in the Go benchmark format, one line
// per repetition with every metric as a unit, and has benchstat compare
// them: old is the pristine build, new the patched build in -mode.
func abCompare(ctx context.Context, cfg config, runs []run) error {
	dir := filepath.Join(".cache", "bench")
	files := map[string]*strings.Builder{"pristine": {}, "patched": {}}
	for _, r := range runs {
		if r.out.Result == nil {
			logf("ab: %s %s %s rep %d: %s", r.scenario.Name, r.c, r.variant.Name, r.rep+1, r.out.Error)
			continue
		}
		b := files[r.variant.Build]
		fmt.Fprintf(b, "%s 1", benchName(r.scenario.Name, r.c))
		keys := make([]string, 0, len(r.out.Result.Metrics))
		for k := range r.out.Result.Metrics {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v, unit := r.out.Result.Metrics[k], k
			// benchstat scales units with SI prefixes; milliseconds
			// would print as "110.6m ms", so give it seconds.
			if base, ok := strings.CutSuffix(k, "_ms"); ok {
				v, unit = v/1000, base+"-sec"
			}
			fmt.Fprintf(b, " %g %s", v, unit)
		}
		b.WriteString("\n")
	}
	oldFile := filepath.Join(dir, "ab-pristine.txt")
	newFile := filepath.Join(dir, "ab-patched-"+cfg.abMode+".txt")
	for name, path := range map[string]string{"pristine": oldFile, "patched": newFile} {
		if err := os.WriteFile(path, []byte(files[name].String()), 0o644); err != nil {
			return err
		}
	}
	logf("ab: %s (old) against %s (new)", oldFile, newFile)
	cmd := exec.CommandContext(ctx, "go", "tool", "benchstat", "pristine="+oldFile, cfg.abMode+"="+newFile)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// benchName turns a scenario and case into a benchmark name benchstat
// groups by: BenchmarkStalledConsumer/publishers=10.
func benchName(scen, c string) string {
	var b strings.Builder
	b.WriteString("Benchmark")
	for part := range strings.SplitSeq(scen, "-") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	if c != "" {
		b.WriteString("/" + strings.ReplaceAll(c, " ", "_"))
	}
	return b.String()
}
