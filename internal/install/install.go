// Package install adopts the patched amqp091-go in a user's module, and
// takes it out again: it is the logic behind `amqp091-drainer install` and
// `amqp091-drainer uninstall`.
//
// Install, in order:
//  1. finds the user's go.mod (walking up from Options.Module) and parses it
//     with golang.org/x/mod/modfile, never by text substitution;
//  2. refuses if the module does not require github.com/rabbitmq/amqp091-go
//     at all (there would be nothing to patch, and adding a dependency is the
//     user's decision, not ours), if go.mod already replaces it with
//     something else, or if go.mod excludes the pinned version;
//  3. builds the patched tree into Options.Dir (default third_party/amqp091-go,
//     relative to the module root) with upstreamtree.Build and the sources
//     compiled into this binary, before touching go.mod, so a failed build
//     never leaves go.mod pointing at a missing folder;
//  4. sets the requirement to the pinned version when it was another one,
//     because the tree is exactly that release, and warns that this is an
//     upgrade or a downgrade;
//  5. adds `replace github.com/rabbitmq/amqp091-go => ./third_party/amqp091-go`
//     and writes go.mod back, formatted by modfile.
//
// Each step prints one line. Running Install again is a no-op: Build's stamp
// makes vendoring a no-op, the requirement and the replace are already in
// place, and go.mod is not written (its bytes stay as they are).
//
// Uninstall drops the replace and removes the vendored folder, and leaves
// the requirement where Install put it, since the version the module had
// before is not recorded anywhere.
//
// The replace has no version on its left-hand side, so it applies to
// whatever version of amqp091-go the build selects, including a higher one
// required by another dependency: the code compiled is always the patched
// pinned release.
package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"

	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
	"github.com/amqp091-drainer/amqp091-drainer/upstream"
)

// DefaultDir is where Install puts the patched tree when Options.Dir is
// empty, relative to the root of the user's module.
const DefaultDir = "third_party/amqp091-go"

// Options say which module to change and where its patched tree lives.
type Options struct {
	// Module is a directory inside the user's module; the module root is
	// the nearest directory at or above it holding a go.mod. Empty means
	// the current directory.
	Module string
	// Dir is the folder of the patched tree. A relative Dir is relative to
	// the module root (not to the current directory), because that is what
	// the replace directive in go.mod is relative to. Empty means
	// DefaultDir.
	Dir string
	// Out receives one line per action, as it happens. Nil discards them.
	Out io.Writer
}

// Report says what Install or Uninstall found and did.
type Report struct {
	GoMod       string // the go.mod file, absolute
	Module      string // the module path it declares
	Dir         string // the patched tree's folder, absolute
	Replacement string // the replace target as written in go.mod, e.g. "./third_party/amqp091-go"

	// Required is the version of amqp091-go the module required before
	// Install ran (Install only).
	Required string
	// Version is the pinned version the patched tree is built from.
	Version string

	Rebuilt      bool // Install built the tree; false when its stamp matched
	Removed      bool // Uninstall removed the tree
	GoModWritten bool // go.mod was rewritten

	Warnings []string // also printed, prefixed with "warning: "
	Actions  []string // every line printed to Options.Out, in order

	out     io.Writer
	pending int // Warnings not printed yet
}

// say prints one action line and records it.
func (r *Report) say(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	r.Actions = append(r.Actions, line)
	fmt.Fprintln(r.out, line)
}

// warn records a warning. Warnings are printed together just before the
// closing line, where they are hardest to miss.
func (r *Report) warn(format string, args ...any) {
	r.Warnings = append(r.Warnings, fmt.Sprintf(format, args...))
	r.pending++
}

func (r *Report) flushWarnings() {
	for _, w := range r.Warnings[len(r.Warnings)-r.pending:] {
		r.say("warning: %s", w)
	}
	r.pending = 0
}

// Changed reports whether Install or Uninstall changed anything on disk.
func (r *Report) Changed() bool { return r.Rebuilt || r.Removed || r.GoModWritten }

// NotRequiredError is Install's refusal to patch a module that does not
// require amqp091-go at all.
type NotRequiredError struct {
	GoMod   string // the go.mod file read
	Module  string // the module path it declares
	Path    string // github.com/rabbitmq/amqp091-go
	Version string // the pinned version, for the suggested go get
}

func (e *NotRequiredError) Error() string {
	return fmt.Sprintf("module %s (%s) does not require %s: nothing to patch; "+
		"add it with `go get %s@%s` first, then run install again",
		e.Module, e.GoMod, e.Path, e.Path, e.Version)
}

// Sources returns the inputs of the patched tree compiled into this binary:
// the pin, the patch set and the overlay files of package upstream.
func Sources() (upstreamtree.Sources, error) {
	pin, err := upstreamtree.ParsePin(upstream.Pin())
	if err != nil {
		return upstreamtree.Sources{}, fmt.Errorf("the built-in pin: %w", err)
	}
	src := upstreamtree.Sources{Pin: pin}
	for _, f := range upstream.Patches() {
		src.Patches = append(src.Patches, upstreamtree.File(f))
	}
	for _, f := range upstream.Overlay() {
		src.Overlay = append(src.Overlay, upstreamtree.File(f))
	}
	return src, nil
}

// FindGoMod returns the go.mod of the module containing dir: the nearest
// go.mod at or above it, which is the file the go command would use there
// with GOWORK unset. An empty dir means the current directory.
func FindGoMod(dir string) (string, error) {
	if dir == "" {
		dir = "."
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(abs); err != nil {
		return "", err
	} else if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", abs)
	}
	for d := abs; ; {
		p := filepath.Join(d, "go.mod")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no go.mod in %s or any folder above it: run this inside your module, or name it with -module", abs)
		}
		d = parent
	}
}

// Install vendors the patched tree into the user's module and points the
// module's go.mod at it. See the package documentation for each step.
//
// On an error the Report still says what was found (it is nil only when
// go.mod could not be found or parsed); a *NotRequiredError means the module
// does not use amqp091-go. Nothing is changed on disk before the checks pass.
func Install(ctx context.Context, opts Options) (*Report, error) {
	src, err := Sources()
	if err != nil {
		return nil, err
	}
	pin := src.Pin
	m, rep, err := load(opts, pin)
	if err != nil {
		return nil, err
	}
	haveReplace, err := m.checkInstall(rep, pin)
	if err != nil {
		return rep, err
	}
	if err := m.vendorTree(ctx, rep, src); err != nil {
		return rep, err
	}
	required, err := m.require(rep, pin)
	if err != nil {
		return rep, err
	}
	replaced := false
	if !haveReplace {
		if err := m.file.AddReplace(pin.Path, "", m.replacement, ""); err != nil {
			return rep, err
		}
		replaced = true
		rep.say("go.mod: added replace %s => %s", pin.Path, m.replacement)
	} else {
		rep.say("go.mod: replace %s => %s already in place", pin.Path, m.replacement)
	}
	if required || replaced {
		if err := m.writeGoMod(rep); err != nil {
			return rep, err
		}
	}
	rep.flushWarnings()
	if rep.Changed() {
		rep.say("next: run `go mod tidy`%s, then build and test as usual; "+
			"conn.ReadMode() reports \"upstream\" until you choose a read mode", m.vendorHint())
	} else {
		rep.say("install: everything is already in place; nothing written")
	}
	return rep, nil
}

// checkInstall runs Install's checks, before anything is written: the
// module requires amqp091-go, does not exclude the pinned release, and
// has no replace of it but Install's own (haveReplace) and no folder in
// the tree's place that Install did not write.
func (m *mod) checkInstall(rep *Report, pin upstreamtree.Pin) (haveReplace bool, err error) {
	var req *modfile.Require
	for _, r := range m.file.Require {
		if r.Mod.Path == pin.Path {
			req = r
			break
		}
	}
	if req == nil {
		return false, &NotRequiredError{GoMod: m.gomod, Module: rep.Module, Path: pin.Path,
			Version: pin.Version}
	}
	rep.Required = req.Mod.Version
	for _, x := range m.file.Exclude {
		if x.Mod.Path == pin.Path && x.Mod.Version == pin.Version {
			return false, fmt.Errorf("%s excludes %s %s, the only version the patched build exists "+
				"for; remove that exclude first", m.gomod, pin.Path, pin.Version)
		}
	}
	for _, r := range m.file.Replace {
		if r.Old.Path != pin.Path {
			continue
		}
		if r.Old.Version == "" && m.isOurs(r) {
			haveReplace = true
			continue
		}
		// Replacing someone else's replace would silently change what the
		// user builds; make them decide.
		old := modVersion(r.Old.Path, r.Old.Version)
		return false, fmt.Errorf("%s already has `replace %s => %s`; remove it first "+
			"(go mod edit -dropreplace=%s) and run install again",
			m.gomod, old, modVersion(r.New.Path, r.New.Version), old)
	}
	return haveReplace, m.checkTreeDir()
}

// vendorTree builds the patched tree in m.dir, or finds it up to date.
func (m *mod) vendorTree(ctx context.Context, rep *Report, src upstreamtree.Sources) error {
	res, err := upstreamtree.Build(ctx, src, m.dir)
	if err != nil {
		return fmt.Errorf("vendoring the patched tree into %s: %w", m.show(m.dir), err)
	}
	rep.Rebuilt = res.Rebuilt
	pin := src.Pin
	extras := plural(len(src.Patches), "patch", "patches") + ", " +
		plural(len(src.Overlay), "overlay file", "overlay files")
	if res.Rebuilt {
		rep.say("vendored: built %s from %s@%s (hash verified), %s",
			m.show(m.dir), pin.Path, pin.Version, extras)
	} else {
		rep.say("vendored: %s is up to date (%s@%s, %s)", m.show(m.dir), pin.Path, pin.Version, extras)
	}
	return nil
}

// require moves the module's requirement of amqp091-go to the pinned
// release, warning which way that moved it; changed reports whether
// go.mod needs writing.
func (m *mod) require(rep *Report, pin upstreamtree.Pin) (changed bool, err error) {
	if rep.Required == pin.Version {
		rep.say("go.mod: require %s %s already in place", pin.Path, pin.Version)
		return false, nil
	}
	// AddRequire rewrites req in place: rep.Required keeps the old one.
	if err := m.file.AddRequire(pin.Path, pin.Version); err != nil {
		return false, err
	}
	rep.say("go.mod: require %s %s -> %s", pin.Path, rep.Required, pin.Version)
	// The tree is the pinned release and nothing else, so the
	// requirement follows it; say which way that moved the module.
	how := "an upgrade (upstream's CHANGELOG.md, in the vendored tree, says what " +
		pin.Version + " changes)"
	if semver.Compare(rep.Required, pin.Version) > 0 {
		how = "a downgrade: anything you use from " + rep.Required + " that " + pin.Version +
			" lacks will not compile"
	}
	rep.warn("module %s required %s %s; the patched build is %s, so the requirement is now %s. "+
		"This is %s; check that your code builds and its tests pass",
		rep.Module, pin.Path, rep.Required, pin.Version, pin.Version, how)
	return true, nil
}

// writeGoMod writes go.mod and records it in the report.
func (m *mod) writeGoMod(rep *Report) error {
	if err := m.write(); err != nil {
		return err
	}
	rep.GoModWritten = true
	rep.say("go.mod: wrote %s", m.gomod)
	return nil
}

// Uninstall drops the replace Install added and removes the vendored tree.
//
// A replace is Install's when it points at Options.Dir or, with Options.Dir
// empty, at any folder holding an upstreamtree stamp (so a tree installed
// with a non-default -dir is found without repeating it). A folder is only
// removed when it holds that stamp: a folder amqp091-drainer did not write is
// left alone, with a warning. The requirement is left as it is. Running it
// on a module without the replace or the folder prints that there is
// nothing to undo.
func Uninstall(ctx context.Context, opts Options) (*Report, error) {
	pin, err := upstreamtree.ParsePin(upstream.Pin())
	if err != nil {
		return nil, fmt.Errorf("the built-in pin: %w", err)
	}
	m, rep, err := load(opts, pin)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	dropped, err := m.dropReplaces(rep, pin, opts.Dir == "")
	if err != nil {
		return rep, err
	}
	// go.mod is written before the tree is removed: if the removal fails,
	// the module builds against upstream and a second run removes the
	// folder, rather than go.mod pointing at a half-deleted one.
	if dropped {
		if err := m.writeGoMod(rep); err != nil {
			return rep, err
		}
	}
	if err := m.removeTree(rep); err != nil {
		return rep, err
	}
	rep.flushWarnings()
	if !rep.Changed() {
		rep.say("uninstall: nothing to undo: go.mod has no replace of %s by amqp091-drainer "+
			"and %s does not exist", pin.Path, m.show(m.dir))
		return rep, nil
	}
	version := "(none)"
	for _, r := range m.file.Require {
		if r.Mod.Path == pin.Path {
			version = r.Mod.Version
		}
	}
	rep.say("next: run `go mod tidy`%s; the requirement stays at %s %s "+
		"(change it with go get if you had another)", m.vendorHint(), pin.Path, version)
	return rep, nil
}

// dropReplaces drops from go.mod (in memory) each replace of amqp091-go
// that is Install's, and points m at the tree it named; anyStamp counts a
// replace of any folder holding a stamp as Install's. A replace Install
// did not add is left, with a warning.
func (m *mod) dropReplaces(rep *Report, pin upstreamtree.Pin, anyStamp bool) (bool, error) {
	dropped := false
	for _, r := range m.file.Replace {
		if r.Old.Path != pin.Path {
			continue
		}
		target, ok := m.target(r)
		if !ok || !(samePath(target, m.dir) || (anyStamp && hasStamp(target))) {
			rep.warn("go.mod has `replace %s => %s`, which amqp091-drainer did not add; left alone",
				modVersion(r.Old.Path, r.Old.Version), modVersion(r.New.Path, r.New.Version))
			continue
		}
		// DropReplace zeroes r: keep what it said first.
		oldVersion, newPath := r.Old.Version, r.New.Path
		if err := m.file.DropReplace(pin.Path, oldVersion); err != nil {
			return dropped, err
		}
		dropped = true
		m.dir, m.replacement = target, newPath
		rep.Dir, rep.Replacement = target, newPath
		rep.say("go.mod: dropped replace %s => %s", modVersion(pin.Path, oldVersion), newPath)
	}
	return dropped, nil
}

// removeTree removes m.dir when it holds the stamp Install writes, and
// its parent when that is left empty; a folder without the stamp is left,
// with a warning, and a missing one is nothing to do.
func (m *mod) removeTree(rep *Report) error {
	fi, err := os.Stat(m.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() || !hasStamp(m.dir) {
		rep.warn("%s was not written by amqp091-drainer (it has no %s); left alone",
			m.show(m.dir), upstreamtree.StampFile)
		return nil
	}
	if err := os.RemoveAll(m.dir); err != nil {
		return fmt.Errorf("removing %s: %w", m.show(m.dir), err)
	}
	rep.Removed = true
	rep.say("removed %s", m.show(m.dir))
	// Tidy up the parent Install created (third_party/) when nothing else
	// lives there; os.Remove fails on a non-empty folder, which is exactly
	// the case to leave alone.
	if parent := filepath.Dir(m.dir); m.inside(parent) && !samePath(parent, m.root) {
		if os.Remove(parent) == nil {
			rep.say("removed %s, now empty", m.show(parent))
		}
	}
	return nil
}

// mod is the user's module as Install and Uninstall see it.
type mod struct {
	gomod       string // absolute path of go.mod
	root        string // its folder
	file        *modfile.File
	dir         string // the tree, absolute
	replacement string // the tree as a replace target, relative to root
}

func load(opts Options, pin upstreamtree.Pin) (*mod, *Report, error) {
	gomod, err := FindGoMod(opts.Module)
	if err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(gomod)
	if err != nil {
		return nil, nil, err
	}
	f, err := modfile.Parse(gomod, data, nil)
	if err != nil {
		return nil, nil, err
	}
	if f.Module == nil {
		return nil, nil, fmt.Errorf("%s has no module directive", gomod)
	}
	if f.Module.Mod.Path == pin.Path {
		return nil, nil, fmt.Errorf("%s is %s itself; run this in the module that uses it", gomod, pin.Path)
	}
	m := &mod{gomod: gomod, root: filepath.Dir(gomod), file: f}
	dir := opts.Dir
	if dir == "" {
		dir = DefaultDir
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(m.root, filepath.FromSlash(dir))
	}
	m.dir = filepath.Clean(dir)
	// The tree must not be the module or contain it: Build replaces the
	// whole folder.
	if rel, err := filepath.Rel(m.dir, m.root); err == nil && !strings.HasPrefix(rel, "..") {
		return nil, nil, fmt.Errorf("-dir %s is the module root or above it; choose a folder inside the module, such as %s", m.dir, DefaultDir)
	}
	m.replacement = replaceTarget(m.root, m.dir)
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	rep := &Report{GoMod: gomod, Module: f.Module.Mod.Path, Dir: m.dir, Replacement: m.replacement,
		Version: pin.Version, out: out}
	return m, rep, nil
}

// replaceTarget spells dir as go.mod wants a directory replacement: relative
// to the module root and starting with ./ or ../, so that the module can be
// moved or cloned elsewhere; absolute only when no relative path exists.
func replaceTarget(root, dir string) string {
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		return filepath.ToSlash(dir)
	}
	rel = filepath.ToSlash(rel)
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return rel
	}
	return "./" + rel
}

// target resolves a replace's right-hand side to a folder, when it is one.
func (m *mod) target(r *modfile.Replace) (string, bool) {
	if r.New.Version != "" || !modfile.IsDirectoryPath(r.New.Path) {
		return "", false
	}
	p := filepath.FromSlash(r.New.Path)
	if !filepath.IsAbs(p) {
		p = filepath.Join(m.root, p)
	}
	return filepath.Clean(p), true
}

// isOurs reports whether r already points at the tree's folder.
func (m *mod) isOurs(r *modfile.Replace) bool {
	t, ok := m.target(r)
	return ok && samePath(t, m.dir)
}

// checkTreeDir refuses a tree folder that holds something amqp091-drainer
// did not write, since Build would replace it wholesale and lose it.
func (m *mod) checkTreeDir() error {
	fi, err := os.Stat(m.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s exists and is not a folder; choose another -dir", m.show(m.dir))
	}
	if hasStamp(m.dir) {
		return nil
	}
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s exists and was not written by amqp091-drainer (it has no %s); "+
			"refusing to replace it: move it away or choose another -dir", m.show(m.dir), upstreamtree.StampFile)
	}
	return nil
}

// write formats go.mod with modfile and replaces the file atomically, so an
// interrupted run leaves either the old go.mod or the new one.
func (m *mod) write() error {
	m.file.Cleanup()
	data := modfile.Format(m.file.Syntax)
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(m.gomod); err == nil {
		mode = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(m.root, ".go.mod-amqp091-drainer-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), m.gomod)
}

// vendorHint reminds users of `go mod vendor` that their vendor folder must
// follow go.mod, or the go command refuses to build.
func (m *mod) vendorHint() string {
	if _, err := os.Stat(filepath.Join(m.root, "vendor", "modules.txt")); err == nil {
		return " and `go mod vendor`"
	}
	return ""
}

// inside reports whether p is within the module root (or is it).
func (m *mod) inside(p string) bool {
	rel, err := filepath.Rel(m.root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// show prints p relative to the module root when it is inside it.
func (m *mod) show(p string) string {
	if rel, err := filepath.Rel(m.root, p); err == nil && m.inside(p) {
		return filepath.ToSlash(rel)
	}
	return p
}

func hasStamp(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, upstreamtree.StampFile))
	return err == nil && fi.Mode().IsRegular()
}

// samePath compares two folders by name and, when both exist, by identity,
// so that a symlinked temp dir or a differently spelled path still matches.
func samePath(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

func modVersion(path, version string) string {
	if version == "" {
		return path
	}
	return path + " " + version
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
