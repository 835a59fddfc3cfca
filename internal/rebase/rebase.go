// Package rebase moves amqp091-drainer onto a new amqp091-go release:
// scripts/rebase VERSION (make rebase VERSION=…), documented in PATCHES.md.
//
// In one run it
//  1. fetches the release through the Go module proxy, checked against the
//     checksum database as the go command checks any dependency, and the
//     pinned one (its hash checked against upstream/PIN);
//  2. applies each patch hunk by hunk: where the hunk's old side stands
//     unchanged (exact, or moved some lines), else by a three-way merge of
//     the file (git merge-file), and never by dropping context (no fuzz);
//  3. when every hunk is placed, writes the patch files anew (git
//     format-patch, keeping each patch's author, date and message), the PIN
//     and the modules' requirements, then vendors, builds and vets, and
//     runs upstream's unit suite (with Full, upstream's whole suite in every
//     read mode, against the new pristine reference);
//  4. checks the drift guards (internal/drift): every upstream function the
//     overlay carries a version of, with upstream's diff where it changed;
//  5. lists the upstream names the overlay uses that the release changed,
//     and rewrites that list in PATCHES.md;
//  6. ends with a report, also saved under .cache/rebase.
//
// A release whose patches do not apply changes nothing: the report says,
// per hunk, what stood in the way, both sides shown.
package rebase

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
	"golang.org/x/mod/semver"

	"github.com/amqp091-drainer/amqp091-drainer/internal/drift"
	"github.com/amqp091-drainer/amqp091-drainer/internal/overlaynames"
	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
)

// Options are what Run needs.
type Options struct {
	Root        string    // the checkout
	Version     string    // the release to move to, e.g. v1.17.0
	AcceptDrift bool      // record the new fingerprints of the guarded functions the release changed
	Full        bool      // also run upstream's whole suite, pristine and in every read mode (needs a broker)
	DryRun      bool      // report what the release would change, and write nothing
	Log         io.Writer // progress, and the output of the commands run
}

// Modes are the read modes in which Full runs upstream's suite, as
// scripts/test does, plus legacy-autodrain.
var Modes = []string{"upstream", "drainer", "legacy", "legacy-autodrain"}

// Report is what a rebase found and did.
type Report struct {
	From, To upstreamtree.Pin
	Hunks    []Hunk
	Patches  []PatchFile
	Drift    []DriftItem
	Names    NameChanges
	Steps    []Step
	Written  []string // files the rebase rewrote, relative to the root
	Mentions []string // files that still mention the old version, "file: n lines"
	DryRun   bool     // nothing was written, and nothing verified
	Err      error    // what stopped the run early, if anything
}

// PatchFile compares a rewritten patch file with the committed one.
type PatchFile struct {
	Name    string
	Same    bool // byte for byte
	Changed string
}

// DriftItem is a guarded function that the release changed, with upstream's
// diff of it.
type DriftItem struct {
	Finding  drift.Finding
	Diff     string
	Accepted bool
}

// NameChanges are the upstream names the overlay uses that the release
// changed or removed, and how the list of used names moved.
type NameChanges struct {
	Changed, Removed []overlaynames.Name
	Added, Dropped   []overlaynames.Name // used names new to the list, and no longer used
	Total            int
	Checked          bool
}

// Step is one verification command.
type Step struct {
	Name     string
	OK       bool
	Duration time.Duration
	Tail     string // the end of its output when it failed, or its summary
}

// Applied reports whether every hunk was placed.
func (r *Report) Applied() bool {
	if len(r.Hunks) == 0 {
		return false
	}
	for _, h := range r.Hunks {
		if h.Status == Conflict {
			return false
		}
	}
	return true
}

// OK reports whether the rebase is complete: applied, every step passed,
// and no unaccepted drift.
func (r *Report) OK() bool {
	if r.Err != nil || !r.Applied() {
		return false
	}
	for _, s := range r.Steps {
		if !s.OK {
			return false
		}
	}
	for _, d := range r.Drift {
		if !d.Accepted {
			return false
		}
	}
	return true
}

// Run rebases the checkout at opts.Root onto opts.Version and returns the
// report; it writes nothing when the patches do not apply.
func Run(ctx context.Context, opts Options) *Report {
	rep := &Report{DryRun: opts.DryRun}
	rep.Err = run(ctx, opts, rep)
	return rep
}

const modulePath = "github.com/rabbitmq/amqp091-go"

// run takes the steps of the package documentation in order, filling rep
// as it goes; its error is what stopped it early.
func run(ctx context.Context, opts Options, rep *Report) error {
	logf := func(format string, args ...any) { fmt.Fprintf(opts.Log, "rebase: "+format+"\n", args...) }
	if !semver.IsValid(opts.Version) || semver.Canonical(opts.Version) != opts.Version {
		return fmt.Errorf("version %q: want a release such as v1.17.0", opts.Version)
	}
	root := opts.Root
	var err error
	if rep.From, err = upstreamtree.ReadPin(root); err != nil {
		return err
	}
	scratch, err := os.MkdirTemp("", "amqp091-rebase-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	logf("fetching %s@%s (pinned) and @%s through the Go module proxy",
		modulePath, rep.From.Version, opts.Version)
	oldTree, newTree, err := fetchTrees(ctx, scratch, opts.Version, rep)
	if err != nil {
		return err
	}
	patches, err := readPatches(filepath.Join(root, "upstream", "patches"))
	if err != nil {
		return err
	}
	logf("applying %d patches to %s", len(patches), opts.Version)
	states, headers, err := applyAll(ctx, scratch, oldTree, newTree, rep, patches)
	if err != nil {
		return err
	}
	if !rep.Applied() {
		logf("the patches do not apply to %s: nothing written", opts.Version)
		return nil
	}
	formatted, err := formatPatches(ctx, scratch, states, headers)
	if err != nil {
		return fmt.Errorf("writing the patches: %w", err)
	}
	for i, p := range patches {
		rep.Patches = append(rep.Patches, comparePatch(p, formatted[i]))
	}
	if err := checkDrift(ctx, root, oldTree, newTree, opts, rep); err != nil {
		return err
	}
	if opts.DryRun {
		return nil
	}
	if err := write(ctx, root, opts, rep, patches, formatted); err != nil {
		return err
	}
	verify(ctx, opts, rep, logf)
	if err := checkNames(root, oldTree, newTree, rep); err != nil {
		rep.Steps = append(rep.Steps, Step{Name: "list the upstream names the overlay uses (PATCHES.md)",
			Tail: err.Error()})
	}
	if rep.From.Version != rep.To.Version {
		rep.Mentions = mentions(ctx, root, rep.From.Version)
	}
	return nil
}

// fetchTrees fetches the pinned release (rep.From) and version through
// the module proxy, sets rep.To, and extracts both under scratch.
func fetchTrees(ctx context.Context, scratch, version string,
	rep *Report) (oldTree, newTree string, err error) {
	oldZip, err := upstreamtree.Fetch(ctx, rep.From)
	if err != nil {
		return "", "", err
	}
	newZip, newHash, err := upstreamtree.FetchVersion(ctx, modulePath, version)
	if err != nil {
		return "", "", err
	}
	rep.To = upstreamtree.Pin{Path: modulePath, Version: version, Hash: newHash}
	oldTree, newTree = filepath.Join(scratch, "old"), filepath.Join(scratch, "new")
	if err := upstreamtree.Extract(rep.From, oldZip, oldTree); err != nil {
		return "", "", err
	}
	if err := upstreamtree.Extract(rep.To, newZip, newTree); err != nil {
		return "", "", err
	}
	return oldTree, newTree, nil
}

type patchFile struct {
	name string
	data []byte
}

func readPatches(dir string) ([]patchFile, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.patch"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []patchFile
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, patchFile{name: filepath.Base(n), data: data})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no patches in %s", dir)
	}
	return out, nil
}

// applyAll applies the patches in order to both releases: exactly to the
// pinned one (the committed state, and the base of any three-way merge),
// hunk by hunk to the new one. It returns the new release's touched files
// before the patches (states[0]) and after each, and each patch's header.
func applyAll(ctx context.Context, scratch, oldTree, newTree string, rep *Report,
	patches []patchFile) ([]map[string]string, []*gitdiff.PatchHeader, error) {
	all, touched, err := parsePatches(patches)
	if err != nil {
		return nil, nil, err
	}
	oldState, newState, err := readStates(oldTree, newTree, touched)
	if err != nil {
		return nil, nil, err
	}
	a := applier{ctx: ctx, scratch: scratch, rep: rep, oldState: oldState, newState: newState}
	states := []map[string]string{clone(newState)}
	var headers []*gitdiff.PatchHeader
	for i, p := range all {
		for _, f := range p.files {
			if err := a.apply(patches[i].name, f); err != nil {
				return nil, nil, err
			}
		}
		states = append(states, clone(newState))
		headers = append(headers, p.header)
	}
	return states, headers, nil
}

// parsedPatch is a patch file's changes and its format-patch header.
type parsedPatch struct {
	files  []*gitdiff.File
	header *gitdiff.PatchHeader
}

// parsePatches parses each patch, and returns the files they touch. A
// rebase handles changes to existing text files only, each patch with the
// header git format-patch writes, so that the rewritten patch keeps it.
func parsePatches(patches []patchFile) ([]parsedPatch, map[string]bool, error) {
	var all []parsedPatch
	touched := map[string]bool{}
	for _, p := range patches {
		files, preamble, err := gitdiff.Parse(bytes.NewReader(p.data))
		if err != nil {
			return nil, nil, fmt.Errorf("patch %s: %w", p.name, err)
		}
		header, err := gitdiff.ParsePatchHeader(preamble)
		if err != nil || header.Author == nil {
			return nil, nil, fmt.Errorf("patch %s: want a git format-patch header "+
				"(From:, Date:, Subject:): %v", p.name, err)
		}
		for _, f := range files {
			if f.IsBinary || f.IsNew || f.IsDelete || f.IsRename || f.IsCopy {
				return nil, nil, fmt.Errorf("patch %s: %s: a rebase handles changes to existing "+
					"text files only", p.name, f.NewName)
			}
			touched[f.NewName] = true
		}
		all = append(all, parsedPatch{files, header})
	}
	return all, touched, nil
}

// readStates reads the touched files of both releases. The pinned one
// must have each; the new one may lack some (apply reports that).
func readStates(oldTree, newTree string,
	touched map[string]bool) (oldState, newState map[string]string, err error) {
	oldState, newState = map[string]string{}, map[string]string{}
	for name := range touched {
		o, err := os.ReadFile(filepath.Join(oldTree, filepath.FromSlash(name)))
		if err != nil {
			return nil, nil, fmt.Errorf("the patches change %s, which the pinned release lacks: %w",
				name, err)
		}
		oldState[name] = string(o)
		if n, err := os.ReadFile(filepath.Join(newTree, filepath.FromSlash(name))); err == nil {
			newState[name] = string(n)
		}
	}
	return oldState, newState, nil
}

// applier carries both releases' files, as the patches applied so far
// left them, from one patched file to the next.
type applier struct {
	ctx                context.Context
	scratch            string
	rep                *Report
	oldState, newState map[string]string
}

// apply applies one file's changes of the patch named patch: exactly to
// the pinned release, hunk by hunk to the new one, and by a three-way
// merge where a hunk finds no place. Each hunk lands in the report.
func (a *applier) apply(patch string, f *gitdiff.File) error {
	rep, name := a.rep, f.NewName
	var oldPost bytes.Buffer
	if err := gitdiff.Apply(&oldPost, strings.NewReader(a.oldState[name]), f); err != nil {
		return fmt.Errorf("patch %s does not apply to the pinned %s itself (%s: %v); "+
			"run make vendor to see", patch, rep.From.Version, name, err)
	}
	newPre, exists := a.newState[name]
	if !exists {
		for j := range f.TextFragments {
			rep.Hunks = append(rep.Hunks, Hunk{Patch: patch, File: name, Index: j + 1,
				Header: strings.TrimRight(f.TextFragments[j].Header(), "\n"), Status: Conflict,
				Detail: fmt.Sprintf("%s is gone from %s", name, rep.To.Version)})
		}
		return nil
	}
	newPost, hunks, ok := place(patch, f, newPre)
	if !ok {
		merged, conflicts, err := merge3(a.ctx, a.scratch, name, a.oldState[name], oldPost.String(),
			newPre, rep.From.Version, rep.To.Version)
		if err != nil {
			return err
		}
		resolve(hunks, conflicts)
		newPost = merged
	}
	rep.Hunks = append(rep.Hunks, hunks...)
	a.oldState[name] = oldPost.String()
	a.newState[name] = newPost
	return nil
}

// resolve marks the hunks place could not put anywhere: merged, when the
// three-way merge had no conflict, else conflicting, each with a region of
// the merge (in order, the last taking any left over).
func resolve(hunks []Hunk, conflicts []string) {
	var open []*Hunk
	for i := range hunks {
		if hunks[i].Status == Conflict {
			open = append(open, &hunks[i])
		}
	}
	if len(conflicts) == 0 {
		for _, h := range open {
			h.Status = Merged
		}
		return
	}
	for i, h := range open {
		switch {
		case i < len(conflicts) && i == len(open)-1:
			h.Detail = strings.Join(conflicts[i:], "\n")
		case i < len(conflicts):
			h.Detail = conflicts[i]
		default:
			h.Detail = "(see the conflict shown for an earlier hunk of this file)"
		}
	}
}

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// comparePatch says how a rewritten patch differs from the committed one:
// not at all, in positions only (the @@ lines and index hashes), or in its
// content.
func comparePatch(p patchFile, formatted []byte) PatchFile {
	pf := PatchFile{Name: p.name, Same: bytes.Equal(p.data, formatted)}
	if pf.Same {
		return pf
	}
	if bytes.Equal(contentOnly(p.data), contentOnly(formatted)) {
		pf.Changed = "positions only (@@ lines, index hashes, the git version trailer)"
	} else {
		pf.Changed = "content: hunks merged three-way, or the header"
	}
	return pf
}

var (
	positionLine = regexp.MustCompile(`(?m)^(@@ [^@]* @@|index [0-9a-f]+\.\.[0-9a-f]+).*$`)
	signature    = regexp.MustCompile(`\n-- \n[^\n]*\n*$`) // git format-patch's "-- " and git version, which the rebase leaves out
)

func contentOnly(patch []byte) []byte {
	return positionLine.ReplaceAll(signature.ReplaceAll(patch, []byte("\n")), nil)
}

// checkDrift compares the guards' fingerprints with the new release, with
// upstream's diff of each guarded function that changed, and records the
// new fingerprints when the maintainer accepts them.
func checkDrift(ctx context.Context, root, oldTree, newTree string, opts Options, rep *Report) error {
	guardsFile := drift.GuardsFile(root)
	data, err := os.ReadFile(guardsFile)
	if err != nil {
		return err
	}
	guards, err := drift.Parse(data)
	if err != nil {
		return err
	}
	oldFuncs, err := drift.Funcs(oldTree)
	if err != nil {
		return err
	}
	newFuncs, err := drift.Funcs(newTree)
	if err != nil {
		return err
	}
	overlay, err := drift.OverlayFiles(root)
	if err != nil {
		return err
	}
	for _, f := range drift.Check(guards, rep.To.Version, newFuncs, overlay) {
		item := DriftItem{Finding: f}
		if f.Missing == "" {
			item.Diff = diffText(ctx, f.Guard.Upstream, rep.From.Version, rep.To.Version, oldFuncs[f.Guard.Upstream], newFuncs[f.Guard.Upstream])
		}
		rep.Drift = append(rep.Drift, item)
	}
	if !opts.AcceptDrift || opts.DryRun || len(rep.Drift) == 0 || !rep.Applied() {
		return nil
	}
	for _, d := range rep.Drift {
		if d.Finding.Missing != "" {
			return nil // a counterpart to fix by hand: accept nothing
		}
	}
	accepted, err := drift.Accept(guards, newFuncs)
	if err != nil {
		return err
	}
	if err := os.WriteFile(guardsFile, drift.Format(drift.Header(data), accepted), 0o644); err != nil {
		return err
	}
	rep.Written = append(rep.Written, "upstream/guards.txt")
	for i := range rep.Drift {
		rep.Drift[i].Accepted = true
	}
	return nil
}

// diffText is a unified diff of two texts of one function (git diff
// --no-index), or a note when one side is missing.
func diffText(ctx context.Context, name, oldVersion, newVersion, oldText, newText string) string {
	if newText == "" {
		return fmt.Sprintf("%s is not declared at %s", name, newVersion)
	}
	dir, err := os.MkdirTemp("", "amqp091-rebase-diff-")
	if err != nil {
		return err.Error()
	}
	defer os.RemoveAll(dir)
	a, b := filepath.Join(dir, oldVersion), filepath.Join(dir, newVersion)
	if err := os.WriteFile(a, []byte(oldText+"\n"), 0o644); err != nil {
		return err.Error()
	}
	if err := os.WriteFile(b, []byte(newText+"\n"), 0o644); err != nil {
		return err.Error()
	}
	out, _ := git(ctx, dir, nil, "diff", "--no-index", "--no-color", "-U3", oldVersion, newVersion)
	return string(out)
}

// write rewrites the patch files, the PIN, the modules' requirements and
// the version the OpenTelemetry adapter reports.
func write(ctx context.Context, root string, opts Options, rep *Report, patches []patchFile, formatted [][]byte) error {
	for i, p := range patches {
		if err := os.WriteFile(filepath.Join(root, "upstream", "patches", p.name), formatted[i], 0o644); err != nil {
			return err
		}
		if !rep.Patches[i].Same {
			rep.Written = append(rep.Written, "upstream/patches/"+p.name)
		}
	}
	if rep.From.Version == rep.To.Version {
		return nil
	}
	if err := os.WriteFile(filepath.Join(root, "upstream", "PIN"), []byte(rep.To.String()+"\n"), 0o644); err != nil {
		return err
	}
	rep.Written = append(rep.Written, "upstream/PIN")
	mods, err := requiringModules(root, rep.From.Version)
	if err != nil {
		return err
	}
	for _, m := range mods {
		cmd := exec.CommandContext(ctx, "go", "mod", "edit", "-require="+modulePath+"@"+rep.To.Version)
		cmd.Dir = filepath.Join(root, filepath.Dir(m))
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go mod edit in %s: %v: %s", cmd.Dir, err, out)
		}
		rep.Written = append(rep.Written, m)
	}
	return rewriteVersion(root, "otelamqp/version.go", rep)
}

// requiringModules lists the go.mod files of the checkout (relative paths)
// that require amqp091-go at version; the vendored tree and caches are
// not ours.
func requiringModules(root, version string) ([]string, error) {
	var mods []string
	want := regexp.MustCompile(`(?m)^\s*(require\s+)?` + regexp.QuoteMeta(modulePath) + `\s+` + regexp.QuoteMeta(version) + `\b`)
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || rel == filepath.Join("upstream", "amqp091-go") || d.Name() == "results") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if want.Match(data) {
			mods = append(mods, filepath.ToSlash(rel))
		}
		return nil
	})
	return mods, err
}

// rewriteVersion replaces the quoted release number (without its v) in
// file, where the adapter reports the release it instruments.
func rewriteVersion(root, file string, rep *Report) error {
	p := filepath.Join(root, filepath.FromSlash(file))
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	old := `"` + strings.TrimPrefix(rep.From.Version, "v") + `"`
	if !bytes.Contains(data, []byte(old)) {
		return fmt.Errorf("%s does not report %s: update the rebase (internal/rebase) with what it reports now", file, old)
	}
	data = bytes.ReplaceAll(data, []byte(old), []byte(`"`+strings.TrimPrefix(rep.To.Version, "v")+`"`))
	rep.Written = append(rep.Written, file)
	return os.WriteFile(p, data, 0o644)
}

// verify vendors the new tree, builds and vets, and runs upstream's suite
// (unit, or with Full the whole suite in every mode) against a pristine
// reference of the new release. Each step runs even when one before it
// failed, unless it needs the tree that vendoring builds.
func verify(ctx context.Context, opts Options, rep *Report, logf func(string, ...any)) {
	type cmd struct {
		name string
		dir  string
		args []string
	}
	tree := filepath.Join("upstream", "amqp091-go")
	steps := []cmd{
		{"vendor the patched tree", ".", []string{"go", "run", "./internal/bootstrap", "vendor"}},
		{"go.upstream.mod follows go.mod (scripts/sync-modfiles)", ".", []string{"scripts/sync-modfiles"}},
		{"build every package of the checkout", ".", []string{"go", "build", "./..."}},
		{"go vet the patched package", tree, []string{"go", "vet", "."}},
		{"pristine unit reference (upstream/testresults/pristine-unit.txt)", ".", []string{"scripts/upstream-tests", "--tree", "pristine", "--unit-only", "--write-reference"}},
		{"upstream's unit suite on the patched tree", ".", []string{"scripts/upstream-tests", "--tree", "patched", "--unit-only"}},
	}
	if opts.Full {
		steps = append(steps, cmd{"pristine full reference (upstream/testresults/pristine-full.txt)", ".", []string{"scripts/upstream-tests", "--tree", "pristine", "--write-reference"}})
		for _, m := range Modes {
			steps = append(steps, cmd{"upstream's whole suite, " + m + " mode", ".", []string{"scripts/upstream-tests", "--tree", "patched", "--mode", m}})
		}
	}
	for i, s := range steps {
		if i > 0 && !rep.Steps[0].OK {
			rep.Steps = append(rep.Steps, Step{Name: s.name, Tail: "not run: the tree did not vendor"})
			continue
		}
		logf("%s: %s", s.name, strings.Join(s.args, " "))
		start := time.Now()
		c := exec.CommandContext(ctx, s.args[0], s.args[1:]...)
		c.Dir = filepath.Join(opts.Root, s.dir)
		env := append(os.Environ(), "GOWORK=off")
		if s.args[0] == "go" && s.args[1] == "build" {
			env = os.Environ() // the workspace: every module of the checkout
		}
		c.Env = env
		var out bytes.Buffer
		c.Stdout, c.Stderr = io.MultiWriter(&out, opts.Log), io.MultiWriter(&out, opts.Log)
		err := c.Run()
		step := Step{Name: s.name, OK: err == nil, Duration: time.Since(start).Round(time.Second)}
		step.Tail = summary(out.String(), err)
		rep.Steps = append(rep.Steps, step)
		if err := ctx.Err(); err != nil {
			return
		}
	}
	if len(rep.Steps) > 4 {
		// The unit reference is part of the rebase's output.
		rep.Written = append(rep.Written, "upstream/testresults/pristine-unit.txt")
		if opts.Full {
			rep.Written = append(rep.Written, "upstream/testresults/pristine-full.txt")
		}
	}
}

// summary keeps the lines of a step's output that a report needs: the
// suite's tallies when it passed, the last lines when it failed.
func summary(out string, err error) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if err == nil {
		var keep []string
		for _, l := range lines {
			if strings.HasPrefix(l, "upstream suite") || strings.Contains(l, "passed,") || strings.HasPrefix(l, "  FLAKY") {
				keep = append(keep, strings.TrimSpace(l))
			}
		}
		return strings.Join(keep, "\n")
	}
	if len(lines) > 25 {
		lines = lines[len(lines)-25:]
	}
	return strings.Join(lines, "\n") + "\n" + err.Error()
}

// checkNames lists the upstream names the overlay uses on the new tree,
// says which of them the release changed or removed and how the list
// moved, and rewrites the list in PATCHES.md.
func checkNames(root, oldTree, newTree string, rep *Report) error {
	oldDecl, err := overlaynames.Declared(oldTree)
	if err != nil {
		return err
	}
	newDecl, err := overlaynames.Declared(newTree)
	if err != nil {
		return err
	}
	// The names the overlay used before the release, from the list as
	// committed, for what moved.
	doc := filepath.Join(root, "PATCHES.md")
	docData, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	used, err := overlaynames.CheckoutUse(root, newDecl)
	if err != nil {
		return fmt.Errorf("type-checking the patched tree: %w", err)
	}
	nc := NameChanges{Total: len(used), Checked: true}
	before := map[overlaynames.Name]bool{}
	for _, n := range overlaynames.Parse(docData) {
		before[n] = true
	}
	for _, n := range used {
		if !before[n] {
			nc.Added = append(nc.Added, n)
		}
		delete(before, n)
		if old, ok := oldDecl[n]; ok && old != newDecl[n] {
			nc.Changed = append(nc.Changed, n)
		}
	}
	for n := range before {
		nc.Dropped = append(nc.Dropped, n)
		if _, ok := newDecl[n]; !ok {
			nc.Removed = append(nc.Removed, n)
		}
	}
	overlaynames.Sort(nc.Dropped)
	overlaynames.Sort(nc.Removed)
	rep.Names = nc
	updated, err := overlaynames.Replace(docData, overlaynames.Markdown(used))
	if err != nil {
		return err
	}
	if !bytes.Equal(updated, docData) {
		rep.Written = append(rep.Written, "PATCHES.md")
		return os.WriteFile(doc, updated, 0o644)
	}
	return nil
}

// mentions lists the tracked files that still name the old release, for
// the maintainer to read (many rightly keep it: measurements, history).
func mentions(ctx context.Context, root, version string) []string {
	out, err := git(ctx, root, nil, "grep", "-c", "-F", version, "--", ".", ":!upstream/testresults")
	if err != nil {
		var gerr *gitError
		if errors.As(err, &gerr) && gerr.code == 1 {
			return nil // nothing found
		}
		return []string{"(git grep: " + err.Error() + ")"}
	}
	var list []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f, n, ok := strings.Cut(l, ":"); ok {
			list = append(list, f+": "+n)
		}
	}
	return list
}
