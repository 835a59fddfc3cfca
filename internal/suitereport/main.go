// Command suitereport turns the `go test -json` output of upstream's suite
// into a sorted outcome list and a one-line summary, and compares the list
// with a reference run.
//
// Usage:
//
//	suitereport -json run.json [-ours DIR] [-write FILE] [-reference FILE] [-exclude FILE] [-label TEXT]
//	suitereport -json run.json -baseline FILE [-regressions FILE] [-normalize-ids] [-write FILE] [-label TEXT]
//
// Each outcome line is "PASS|FAIL|SKIP TestName[/subtest]". Tests declared
// in the *_test.go files of -ours (our overlay) are reported apart, so the
// patched tree's outcome list can be compared line for line with the
// pristine tree's. Tests named in -exclude (one "TestName reason" per line,
// as the read modes that cannot run them list them) are left out of the
// comparison. The command exits 1 when a test failed, when the run did not
// finish, or when the list differs from -reference.
//
// -baseline judges a run against the outcome list of a reference run (the
// third-party suites, scripts/thirdparty-tests, judge each read mode
// against the pristine release this way): a test that failed in the
// baseline too is reported and not judged; a test that failed here but
// passed in the baseline, or has no outcome there, is a regression, and so
// is a test that passed or skipped in the baseline and did not run here (a
// build failure, a crash); only regressions, or a run that did not finish,
// make the command exit 1.
// -regressions writes their names, one per line, for a rerun. Tests named
// in -exclude, which the run left out on purpose, are dropped from the
// baseline.
// -normalize-ids replaces test-name elements that are UUIDs with "*", for
// suites that name subtests after a random ID (watermill's).
//
// A test that ran more than once (go test -count=N) is failed when any of
// its runs failed, and the summary says how many of its runs failed.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// event is one line of test2json output.
type event struct {
	Time    time.Time
	Action  string
	Test    string
	Elapsed float64
	Output  string
}

type outcome struct {
	name    string
	action  string // pass, fail or skip; fail when any run failed
	elapsed float64
	tail    []string // the test's last output lines, kept for failures
	runs    int      // how many times it ran (go test -count)
	fails   int      // how many of those runs failed
}

// tailLines is how much of a failed test's output the summary repeats: CI
// keeps only the summary, and a flaky failure is not reproduced on demand.
const tailLines = 25

func main() {
	jsonFile := flag.String("json", "", "go test -json output to read")
	oursDir := flag.String("ours", "", "folder whose *_test.go files declare our own tests")
	write := flag.String("write", "", "write the outcome list to this file")
	reference := flag.String("reference", "", "compare the outcome list with this file")
	label := flag.String("label", "upstream suite", "what the summary line names")
	exclude := flag.String("exclude", "", "file of tests (\"TestName reason\" per line) left out of the comparison")
	baseline := flag.String("baseline", "", "judge failures against this outcome list: only tests that passed there count")
	regressions := flag.String("regressions", "", "with -baseline: write the regressed tests' names to this file")
	normalize := flag.Bool("normalize-ids", false, "replace UUID elements of test names with *")
	flag.Parse()
	if *regressions != "" && *baseline == "" {
		fmt.Fprintln(os.Stderr, "suitereport: -regressions needs -baseline")
		os.Exit(2)
	}
	normalizeIDs = *normalize
	code, err := run(*jsonFile, *oursDir, *write, *reference, *exclude, *label, os.Stdout)
	if err == nil && *baseline != "" {
		var c int
		var excluded map[string]bool
		if excluded, err = excludedTests(*exclude); err == nil {
			c, err = judge(*jsonFile, *baseline, *regressions, excluded, os.Stdout)
		}
		// Against a baseline, failures that the baseline shares are not
		// judged: only judge decides, with run's verdict on an unfinished run.
		if code == 1 && c == 0 {
			code = unfinished
		}
		code = max(code, c)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "suitereport:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

// run reports the run in jsonFile: the summary line and each test that did
// not pass, ours apart, and the comparison with reference. Its code is 1
// when a test failed, the run did not finish, or the list differs.
func run(jsonFile, oursDir, write, reference, exclude, label string, out io.Writer) (int, error) {
	if jsonFile == "" {
		return 0, fmt.Errorf("-json is required")
	}
	results, finished, wall, err := parseFile(jsonFile)
	if err != nil {
		return 0, err
	}
	ours, err := ourTests(oursDir)
	if err != nil {
		return 0, err
	}
	var theirs, mine []outcome
	for _, r := range results {
		if ours[strings.SplitN(r.name, "/", 2)[0]] {
			mine = append(mine, r)
		} else {
			theirs = append(theirs, r)
		}
	}
	list := format(theirs)
	if write != "" {
		if err := os.WriteFile(write, []byte(list), 0o644); err != nil {
			return 0, err
		}
	}
	code := 0
	if summarize(out, label, theirs, mine, wall) > 0 {
		code = 1
	}
	if !finished {
		fmt.Fprintln(out, "the test binary did not finish (crash, panic or timeout): see the raw output")
		unfinished = 1
		code = 1
	}
	if reference != "" {
		same, err := compareReference(out, reference, exclude, list)
		if err != nil {
			return 0, err
		}
		if !same {
			code = 1
		}
	}
	return code, nil
}

// parseFile parses the test2json output in the file named jsonFile.
func parseFile(jsonFile string) (results []outcome, finished bool, wall time.Duration, err error) {
	f, err := os.Open(jsonFile)
	if err != nil {
		return nil, false, 0, err
	}
	defer f.Close()
	return parse(f)
}

// summarize prints the summary line of upstream's tests (theirs) with each
// that did not pass, then our overlay's (mine) with each failure, then the
// repeated runs; it returns how many failed, of both.
func summarize(out io.Writer, label string, theirs, mine []outcome, wall time.Duration) (fail int) {
	pass, fail, skip := count(theirs)
	fmt.Fprintf(out, "%s: %d passed, %d failed, %d skipped (%d top-level tests) in %s\n",
		label, pass, fail, skip, topLevel(theirs), wall.Round(time.Second))
	for _, r := range theirs {
		if r.action != "pass" {
			fmt.Fprintf(out, "  %s %s\n", strings.ToUpper(r.action), r.name)
			printTail(out, r)
		}
	}
	if len(mine) > 0 {
		p, fl, s := count(mine)
		fmt.Fprintf(out, "overlay tests: %d passed, %d failed, %d skipped\n", p, fl, s)
		fail += fl
		for _, r := range mine {
			if r.action == "fail" {
				fmt.Fprintf(out, "  FAIL %s\n", r.name)
				printTail(out, r)
			}
		}
	}
	printRepeated(out, theirs)
	return fail
}

// compareReference compares the outcome list with the reference file,
// both without the tests exclude names, and prints the difference.
func compareReference(out io.Writer, reference, exclude, list string) (same bool, err error) {
	want, err := os.ReadFile(reference)
	if err != nil {
		return false, err
	}
	excluded, err := excludedTests(exclude)
	if err != nil {
		return false, err
	}
	if len(excluded) > 0 {
		fmt.Fprintf(out, "%d top-level tests excluded for this read mode (%s)\n", len(excluded), exclude)
	}
	if diff := compare(dropExcluded(string(want), excluded), list); diff != "" {
		fmt.Fprintf(out, "differs from the reference %s:\n%s", reference, diff)
		return false, nil
	}
	fmt.Fprintf(out, "same outcomes as the reference %s\n", reference)
	return true, nil
}

// normalizeIDs is -normalize-ids; unfinished is 1 once run saw a run that
// did not finish (judge keeps that verdict).
var (
	normalizeIDs bool
	unfinished   int
)

var uuidElem = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// testName is a test2json test name, its UUID elements replaced with "*"
// under -normalize-ids.
func testName(name string) string {
	if !normalizeIDs {
		return name
	}
	parts := strings.Split(name, "/")
	for i, p := range parts {
		if uuidElem.MatchString(p) {
			parts[i] = "*"
		}
	}
	return strings.Join(parts, "/")
}

// parse reads test2json events; finished reports whether the package itself
// reached a pass or fail verdict in every run of it that the events hold (a
// suite run in halves, scripts/upstream-suites, holds two), and wall is the
// sum of those runs' times.
func parse(r io.Reader) (results []outcome, finished bool, wall time.Duration, err error) {
	byName := map[string]outcome{}
	output := map[string][]string{}
	starts, ends := 0, 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // go test prints build errors as plain text
		}
		e.Test = testName(e.Test)
		switch e.Action {
		case "start":
			starts++
		case "output":
			if e.Test != "" {
				lines := append(output[e.Test], strings.TrimRight(e.Output, "\n"))
				if len(lines) > tailLines {
					lines = lines[len(lines)-tailLines:]
				}
				output[e.Test] = lines
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				ends++
				wall += time.Duration(e.Elapsed * float64(time.Second))
				continue
			}
			prev, seen := byName[e.Test]
			o := outcome{name: e.Test, action: e.Action, elapsed: e.Elapsed, runs: prev.runs + 1, fails: prev.fails}
			if e.Action == "fail" {
				o.tail = output[e.Test]
				o.fails++
			} else if seen && prev.action == "fail" {
				// a later run passed: the test stays failed, with the
				// output of its last failed run.
				o.action, o.tail = "fail", prev.tail
			}
			delete(output, e.Test)
			byName[e.Test] = o
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, 0, err
	}
	for _, o := range byName {
		results = append(results, o)
	}
	sort.Slice(results, func(i, j int) bool { return results[i].name < results[j].name })
	// Before Go 1.20 test2json wrote no start event: then one verdict is all.
	return results, ends > 0 && ends >= starts, wall, nil
}

// printRepeated says, for every test that ran more than once, how many of
// its runs failed.
func printRepeated(out io.Writer, rs []outcome) {
	for _, r := range rs {
		if r.runs > 1 {
			fmt.Fprintf(out, "  %s: %d of %d runs failed\n", r.name, r.fails, r.runs)
		}
	}
}

// judge compares the run's failures with a baseline outcome list and
// reports, apart, the failures the baseline shares (not judged) and the
// regressions: tests that failed here and passed in the baseline or have no
// outcome there. It exits 1 when there is a regression.
func judge(jsonFile, baseline, regressionsFile string, excluded map[string]bool,
	out io.Writer) (int, error) {
	results, _, _, err := parseFile(jsonFile)
	if err != nil {
		return 0, err
	}
	base, err := readBaseline(baseline, excluded)
	if err != nil {
		return 0, err
	}
	shared, regressed, fixed := classify(results, base)
	for _, l := range []struct {
		head  string
		names []string
	}{
		{"failed in the baseline too (not judged)", shared},
		{"passed here, failed in the baseline", fixed},
		{"REGRESSIONS (failed here only)", regressed},
	} {
		if len(l.names) > 0 {
			fmt.Fprintf(out, "%s: %d\n", l.head, len(l.names))
			for _, n := range l.names {
				fmt.Fprintf(out, "  %s\n", n)
			}
		}
	}
	if regressionsFile != "" {
		var b strings.Builder
		for _, n := range regressed {
			b.WriteString(strings.SplitN(n, " (", 2)[0] + "\n")
		}
		if err := os.WriteFile(regressionsFile, []byte(b.String()), 0o644); err != nil {
			return 0, err
		}
	}
	if len(regressed) > 0 {
		return 1, nil
	}
	fmt.Fprintf(out, "no regression against the baseline %s\n", baseline)
	return 0, nil
}

// readBaseline reads an outcome list into test name → pass, fail or skip,
// leaving out comments and the top-level tests in excluded.
func readBaseline(baseline string, excluded map[string]bool) (map[string]string, error) {
	data, err := os.ReadFile(baseline)
	if err != nil {
		return nil, err
	}
	base := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && !strings.HasPrefix(f[0], "#") && !excluded[strings.SplitN(f[1], "/", 2)[0]] {
			base[f[1]] = strings.ToLower(f[0])
		}
	}
	return base, nil
}

// classify sorts the run's outcomes against the baseline: failures the
// baseline shares, regressions (each with why), and failures fixed here.
// The regressions that did not run here come first, sorted.
func classify(results []outcome, base map[string]string) (shared, regressed, fixed []string) {
	ran := map[string]bool{}
	for _, r := range results {
		ran[r.name] = true
	}
	for name, b := range base {
		if !ran[name] && b != "fail" {
			// a build failure or a crash runs nothing: that is no pass.
			regressed = append(regressed, name+" (did not run here; "+b+" in the baseline)")
		}
	}
	sort.Strings(regressed)
	for _, r := range results {
		switch {
		case r.action == "fail" && base[r.name] == "fail":
			shared = append(shared, r.name)
		case r.action == "fail":
			why := "passed in the baseline"
			if b, ok := base[r.name]; !ok {
				why = "no outcome in the baseline"
			} else if b == "skip" {
				why = "skipped in the baseline"
			}
			regressed = append(regressed, r.name+" ("+why+")")
		case r.action == "pass" && base[r.name] == "fail":
			fixed = append(fixed, r.name)
		}
	}
	return shared, regressed, fixed
}

// printTail repeats a failed test's last output lines under its name.
func printTail(out io.Writer, r outcome) {
	for _, l := range r.tail {
		fmt.Fprintf(out, "      | %s\n", l)
	}
}

// ourTests lists the Test, Fuzz and Example functions declared in dir's
// *_test.go files: go test reports all three as tests.
func ourTests(dir string) (map[string]bool, error) {
	names := map[string]bool{}
	if dir == "" {
		return names, nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil {
				continue
			}
			for _, prefix := range []string{"Test", "Fuzz", "Example"} {
				if strings.HasPrefix(fn.Name.Name, prefix) {
					names[fn.Name.Name] = true
				}
			}
		}
	}
	return names, nil
}

func format(rs []outcome) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%s %s\n", strings.ToUpper(r.action), r.name)
	}
	return b.String()
}

func count(rs []outcome) (pass, fail, skip int) {
	for _, r := range rs {
		switch r.action {
		case "pass":
			pass++
		case "fail":
			fail++
		case "skip":
			skip++
		}
	}
	return
}

func topLevel(rs []outcome) int {
	n := 0
	for _, r := range rs {
		if !strings.Contains(r.name, "/") {
			n++
		}
	}
	return n
}

// compare lists the lines only in want ("-") or only in got ("+"); comment
// lines starting with # are ignored.
func compare(want, got string) string {
	set := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				m[l] = true
			}
		}
		return m
	}
	w, g := set(want), set(got)
	var diff []string
	for l := range w {
		if !g[l] {
			diff = append(diff, "  - "+l)
		}
	}
	for l := range g {
		if !w[l] {
			diff = append(diff, "  + "+l)
		}
	}
	sort.Slice(diff, func(i, j int) bool { return diff[i][4:] < diff[j][4:] })
	if len(diff) == 0 {
		return ""
	}
	return strings.Join(diff, "\n") + "\n"
}

// excludedTests reads a list of "TestName reason" lines; # starts a comment.
func excludedTests(file string) (map[string]bool, error) {
	names := map[string]bool{}
	if file == "" {
		return names, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			names[f[0]] = true
		}
	}
	return names, nil
}

// dropExcluded removes the outcome lines of excluded tests and their subtests.
func dropExcluded(list string, excluded map[string]bool) string {
	var b strings.Builder
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && excluded[strings.SplitN(f[1], "/", 2)[0]] {
			continue
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
