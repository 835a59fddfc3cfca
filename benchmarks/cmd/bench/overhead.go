package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// overheadScenario is the Observer-overhead section's name on the command
// line. It is not one of benchscenario's scenarios: otelamqp/cmd/overhead
// measures it, in a module of its own (otelamqp, with the OpenTelemetry
// SDK), which the runner cannot link and so starts as `go run`.
const overheadScenario = "overhead"

// overheadResult is the Observer-overhead section as results.json keeps
// it: the command's Markdown, whole, so that -render writes the section
// again without measuring; or why there is none.
type overheadResult struct {
	Command  string `json:"command"`
	Markdown string `json:"markdown,omitempty"`
	Error    string `json:"error,omitempty"`
}

// overheadArgs are the command's sizes: 5 rounds of 20,000 messages per
// variant and path, or one of 2,000 under -quick, which checks that it
// runs.
func overheadArgs(quick bool) []string {
	if quick {
		return []string{"-rounds", "1", "-n", "2000"}
	}
	return []string{"-rounds", "5", "-n", "20000"}
}

// runOverhead runs otelamqp/cmd/overhead against brokerURL. Its progress
// lines go to the runner's standard error as they come.
func runOverhead(ctx context.Context, brokerURL string, quick bool) *overheadResult {
	args := append([]string{"run", "./cmd/overhead"}, overheadArgs(quick)...)
	args = append(args, "-markdown")
	res := &overheadResult{Command: "(cd otelamqp && GOWORK=off go " + strings.Join(args, " ") + ")"}
	logf("Observer overhead: %s", res.Command)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = "otelamqp"
	cmd.Env = append(os.Environ(), "GOWORK=off", "AMQP_URL="+brokerURL)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		res.Error = err.Error()
		return res
	}
	res.Markdown = stdout.String()
	return res
}

// writeOverhead appends the Observer-overhead section to the report: the
// command's own Markdown, which heads itself "## Observer overhead".
func writeOverhead(w func(string, ...any), o *overheadResult) {
	if o == nil {
		return
	}
	if o.Error != "" {
		w("## Observer overhead\n\nNot measured: `%s` failed: %s.\n\n", o.Command, o.Error)
		return
	}
	w("%s\n", strings.TrimSpace(o.Markdown))
}

// sectionWanted says whether the section (failover, overhead) named name
// runs: when -scenarios is empty (everything) or names it.
func sectionWanted(cfg config, name string) bool {
	return cfg.scenarios == "" || contains(strings.Split(cfg.scenarios, ","), name)
}

// microWanted says whether the micro-benchmarks run: with the
// allocations scenario, whose per-message figures they resolve.
func microWanted(cfg config) bool {
	return sectionWanted(cfg, "allocations")
}

// withoutSections drops the sections (failover, overhead) from
// -scenarios, for the per-process scenario plan; ok is false when nothing
// else is left.
func withoutSections(cfg config) (config, bool) {
	if cfg.scenarios == "" {
		return cfg, true
	}
	var rest []string
	for _, s := range strings.Split(cfg.scenarios, ",") {
		if s = strings.TrimSpace(s); s != failoverScenario && s != overheadScenario {
			rest = append(rest, s)
		}
	}
	cfg.scenarios = strings.Join(rest, ",")
	return cfg, len(rest) > 0
}

// errOverhead is the error runSuite returns, after writing the report,
// when the overhead section could not be measured: the rest of the run
// is kept, and make still fails.
func errOverhead(o *overheadResult) error {
	if o == nil || o.Error == "" {
		return nil
	}
	return fmt.Errorf("the Observer overhead section: %s: %s", o.Command, o.Error)
}
