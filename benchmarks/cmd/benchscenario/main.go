// Command benchscenario runs one benchmark scenario, one case, in one read
// mode, and prints what it measured as JSON on standard output. The runner
// (benchmarks/cmd/bench) builds it twice, against pristine upstream and
// against the patched tree, and starts it once per measurement.
//
//	benchscenario -scenario stalled-consumer -mode drainer
//	benchscenario -list
//
// The broker is AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/), and
// Toxiproxy, for the scenarios that inject faults, is TOXIPROXY_URL.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
)

const defaultTimeout = 2 * time.Minute

func main() {
	name := flag.String("scenario", "", "scenario to run")
	c := flag.String("case", "", "case of the scenario")
	mode := flag.String("mode", readmode.Upstream, "read mode: upstream, legacy or drainer")
	quick := flag.Bool("quick", false, "smoke-test sizes")
	list := flag.Bool("list", false, "list the scenarios as JSON and exit")
	messages := flag.Int("n", 0, "message count for the scenarios that take one; 0 means the scenario's own")
	artefacts := flag.String("artefacts", "", "path prefix for files the run saves beside the results (CPU profiles); empty saves none")
	flag.Parse()

	if *list {
		var ls []scenario.Listing
		for _, n := range scenario.Names() {
			s, _ := scenario.Lookup(n)
			ls = append(ls, scenario.Listing{Name: n, Cases: s.CaseList(), Modes: s.Modes, ReferenceCase: s.ReferenceCase,
				Reps: s.Reps, QuickReps: s.QuickReps, Counted: s.Counted, Concurrent: s.Concurrent, Timeout: timeout(s)})
		}
		emit(ls)
		return
	}

	out := scenario.Output{Scenario: *name, Case: *c, Build: readmode.Build, AMQP091: amqpBuild(), Mode: *mode,
		GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), Started: time.Now()}
	s, err := scenario.Lookup(*name)
	if err != nil {
		out.Error = err.Error()
		emit(out)
		os.Exit(2)
	}
	env := &scenario.Env{URL: brokerURL(), Toxiproxy: os.Getenv("TOXIPROXY_URL"), Mode: *mode, Quick: *quick,
		Messages: *messages, Artefacts: *artefacts}

	ctx, cancel := context.WithTimeout(context.Background(), timeout(s))
	defer cancel()
	// A run that ignores its context (a wedged upstream reader, say) is
	// still bounded: report it and exit without waiting for it.
	go func() {
		<-ctx.Done()
		time.Sleep(10 * time.Second)
		out.Error = fmt.Sprintf("run did not return within %v of its %v timeout", 10*time.Second, timeout(s))
		out.Seconds = time.Since(out.Started).Seconds()
		emit(out)
		os.Exit(3)
	}()

	res, err := s.Run(ctx, env, *c)
	env.Cleanup()
	out.Seconds = time.Since(out.Started).Seconds()
	out.Result = res
	if err != nil {
		out.Error = err.Error()
		emit(out)
		os.Exit(1)
	}
	emit(out)
}

func timeout(s *scenario.Scenario) time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return defaultTimeout
}

func brokerURL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func emit(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
