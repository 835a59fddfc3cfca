package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeRun writes a test2json stream: one pass/fail/skip event per
// "action name" pair, then the package's verdict when finished.
func writeRun(t *testing.T, finished bool, events ...string) string {
	t.Helper()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	now := time.Unix(0, 0)
	for _, e := range events {
		action, name, _ := strings.Cut(e, " ")
		if err := enc.Encode(event{Time: now, Action: "output", Test: name, Output: "--- " + strings.ToUpper(action) + "\n"}); err != nil {
			t.Fatal(err)
		}
		if err := enc.Encode(event{Time: now, Action: action, Test: name}); err != nil {
			t.Fatal(err)
		}
	}
	if finished {
		if err := enc.Encode(event{Time: now, Action: "pass"}); err != nil {
			t.Fatal(err)
		}
	}
	f := filepath.Join(t.TempDir(), "run.json")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestJudgeAgainstBaseline(t *testing.T) {
	dir := t.TempDir()
	baseline := filepath.Join(dir, "baseline.txt")
	os.WriteFile(baseline, []byte("FAIL TestShared\nPASS TestNew\nFAIL TestFixed\nPASS TestGone\nSKIP TestSkipped\nFAIL TestGoneFailing\n"), 0o644)
	run := writeRun(t, true, "fail TestShared", "fail TestNew", "pass TestFixed", "fail TestUnknown", "pass TestSkipped")
	regressions := filepath.Join(dir, "regressed")
	var out strings.Builder
	code, err := judge(run, baseline, regressions, nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	if code != 1 {
		t.Errorf("exit code %d, want 1\n%s", code, &out)
	}
	got, _ := os.ReadFile(regressions)
	// TestGone passed in the baseline and did not run: a regression;
	// TestGoneFailing failed there, so its absence is not judged.
	if want := "TestGone\nTestNew\nTestUnknown\n"; string(got) != want {
		t.Errorf("regressions %q, want %q\n%s", got, want, &out)
	}
	for _, s := range []string{"not judged): 1\n  TestShared", "failed in the baseline: 1\n  TestFixed"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("report lacks %q:\n%s", s, &out)
		}
	}

	run = writeRun(t, true, "fail TestShared", "pass TestNew", "pass TestGone", "pass TestSkipped", "pass TestFixed")
	out.Reset()
	if code, err := judge(run, baseline, "", nil, &out); err != nil || code != 0 {
		t.Errorf("judge = %d, %v; want 0 (only a shared failure)\n%s", code, err, &out)
	}

	// A test left out on purpose (-exclude) is not missed.
	run = writeRun(t, true, "fail TestShared", "pass TestNew", "pass TestSkipped", "pass TestFixed")
	out.Reset()
	if code, err := judge(run, baseline, "", map[string]bool{"TestGone": true}, &out); err != nil || code != 0 {
		t.Errorf("judge with TestGone excluded = %d, %v; want 0\n%s", code, err, &out)
	}
}

func TestNormalizeIDsAndRepeatedRuns(t *testing.T) {
	normalizeIDs = true
	defer func() { normalizeIDs = false }()
	run := writeRun(t, true,
		"pass TestA/Sub/5f3c2a10-1b2c-4d5e-8f90-0123456789ab",
		"pass TestRepeated", "fail TestRepeated", "pass TestRepeated")
	f, err := os.Open(run)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	results, finished, _, err := parse(f)
	if err != nil || !finished {
		t.Fatalf("parse: %v, finished %v", err, finished)
	}
	if got, want := format(results), "PASS TestA/Sub/*\nFAIL TestRepeated\n"; got != want {
		t.Errorf("outcomes %q, want %q", got, want)
	}
	var out strings.Builder
	printRepeated(&out, results)
	if got, want := out.String(), "  TestRepeated: 1 of 3 runs failed\n"; got != want {
		t.Errorf("repeated %q, want %q", got, want)
	}
}

// TestRunInHalves: a suite run in two halves (scripts/upstream-suites) is one
// run whose time is the halves' sum, finished only if both halves finished.
func TestRunInHalves(t *testing.T) {
	half := func(test string, finished bool, seconds float64) string {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		events := []event{{Action: "start"}, {Action: "pass", Test: test}}
		if finished {
			events = append(events, event{Action: "pass", Elapsed: seconds})
		}
		for _, e := range events {
			if err := enc.Encode(e); err != nil {
				t.Fatal(err)
			}
		}
		return b.String()
	}
	for _, tc := range []struct {
		second   bool
		finished bool
		wall     time.Duration
	}{{true, true, 5 * time.Second}, {false, false, 2 * time.Second}} {
		in := half("TestA", true, 2) + half("TestB", tc.second, 3)
		results, finished, wall, err := parse(strings.NewReader(in))
		if err != nil || finished != tc.finished || wall != tc.wall || len(results) != 2 {
			t.Errorf("second half finished %v: parse gave %d results, finished %v, wall %v, err %v; want 2, %v, %v",
				tc.second, len(results), finished, wall, err, tc.finished, tc.wall)
		}
	}
}
