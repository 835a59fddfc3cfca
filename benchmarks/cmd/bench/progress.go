package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// progress says, before each measurement, where the plan stands: which
// run starts, how long the suite has been measuring and about how long
// the rest will take.
//
// Runs differ by orders of magnitude (an error propagation takes a
// second, a drain twenty), so the estimate goes by what is known of each
// remaining run: the mean of its scenario and case's runs so far; else
// how long the same run took in the plan's last results.json (prior);
// else the mean of its scenario's runs so far; else the mean of every run
// so far.
type progress struct {
	start   time.Time
	total   int
	done    int
	byCase  map[string]*mean
	byScen  map[string]*mean
	overall mean
	prior   map[string]time.Duration
}

type mean struct {
	sum time.Duration
	n   int
}

func (m *mean) add(d time.Duration) { m.sum += d; m.n++ }

func (m *mean) get() (time.Duration, bool) {
	if m == nil || m.n == 0 {
		return 0, false
	}
	return m.sum / time.Duration(m.n), true
}

func newProgress(total int, prior map[string]time.Duration) *progress {
	return &progress{start: time.Now(), total: total, byCase: map[string]*mean{}, byScen: map[string]*mean{}, prior: prior}
}

func caseKey(m measurement) string { return m.scenario.Name + "|" + m.c }

// priorKey names a run by what results.json keeps of it: its scenario,
// case, build and mode.
func priorKey(scen, c, build, mode string) string { return scen + "|" + c + "|" + build + "|" + mode }

// record counts a group of measurements that took d of wall time
// together: each member is charged its share, so that the estimate of a
// group run at once (a Concurrent scenario) is the sum of its members'.
func (p *progress) record(g []measurement, d time.Duration) {
	share := d / time.Duration(len(g))
	for _, m := range g {
		p.done++
		k := caseKey(m)
		if p.byCase[k] == nil {
			p.byCase[k] = &mean{}
		}
		if p.byScen[m.scenario.Name] == nil {
			p.byScen[m.scenario.Name] = &mean{}
		}
		p.byCase[k].add(share)
		p.byScen[m.scenario.Name].add(share)
		p.overall.add(share)
	}
}

// estimate is how long m is expected to take; false when nothing is
// known to go by.
func (p *progress) estimate(m measurement) (time.Duration, bool) {
	if d, ok := p.byCase[caseKey(m)].get(); ok {
		return d, true
	}
	// A concurrent scenario's runs each took the whole group's time in
	// results.json: their prior would count it once per run.
	if d, ok := p.prior[priorKey(m.scenario.Name, m.c, m.variant.Build, m.variant.Mode)]; ok && !m.scenario.Concurrent {
		return d, true
	}
	if d, ok := p.byScen[m.scenario.Name].get(); ok {
		return d, true
	}
	return p.overall.get()
}

// remaining sums the estimates of the groups from rest on; false when
// none of them can be estimated yet.
func (p *progress) remaining(rest [][]measurement) (time.Duration, bool) {
	var sum time.Duration
	known := false
	for _, g := range rest {
		for _, m := range g {
			if d, ok := p.estimate(m); ok {
				sum += d
				known = true
			}
		}
	}
	return sum, known
}

// line is the progress line logged as the first group of rest starts.
func (p *progress) line(rest [][]measurement) string {
	g := rest[0]
	m := g[0]
	what := fmt.Sprintf("[%d/%d] %s", p.done+1, p.total, joinNonEmpty(m.scenario.Name, m.c, m.variant.Name,
		fmt.Sprintf("rep %d/%d", m.rep+1, m.reps)))
	if len(g) > 1 {
		what = fmt.Sprintf("[%d-%d/%d] %s: %d runs at once (every variant and repetition)",
			p.done+1, p.done+len(g), p.total, joinNonEmpty(m.scenario.Name, m.c), len(g))
	}
	status := "elapsed " + roundDuration(time.Since(p.start))
	if left, ok := p.remaining(rest); ok {
		status += fmt.Sprintf("; about %s left, ETA %s", roundDuration(left), time.Now().Add(left).Format("15:04:05"))
	}
	return fmt.Sprintf("%s (%s)", what, status)
}

func joinNonEmpty(parts ...string) string {
	s := ""
	for _, p := range parts {
		if p == "" {
			continue
		}
		if s != "" {
			s += " "
		}
		s += p
	}
	return s
}

func roundDuration(d time.Duration) string { return d.Round(time.Second).String() }

// priorDurations reads how long each run took in the last results.json
// under dir, if that run was made at the same sizes (-quick, and each
// scenario's message count); it returns nil otherwise: an estimate from
// other sizes would mislead.
func priorDurations(dir string, quick bool, messages map[string]int) map[string]time.Duration {
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return nil
	}
	var s suite
	if json.Unmarshal(b, &s) != nil || s.Env.Quick != quick {
		return nil
	}
	out := map[string]time.Duration{}
	for _, sr := range s.Scenarios {
		if sr.Messages != messages[sr.Name] {
			continue
		}
		for _, cr := range sr.Cases {
			for _, o := range cr.Runs {
				if o.Seconds > 0 {
					out[priorKey(sr.Name, cr.Case, o.Build, o.Mode)] = time.Duration(o.Seconds * float64(time.Second))
				}
			}
		}
	}
	return out
}
