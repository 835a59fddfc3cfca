// Package drift guards the upstream functions whose logic the overlay
// carries a version of.
//
// The overlay re-does some of upstream's work in its own code: the read
// path's dispatch (upstream's Channel.dispatch), the confirm settling
// (confirms.One and Multiple), the frame encoders, and more; the list, with
// our counterpart of each, is upstream/guards.txt. When upstream changes
// one of those functions, our version silently stops matching it. So each
// guard records a fingerprint of upstream's text of the function at the
// pinned release: the function as go/printer prints it without comments,
// so that comments and formatting do not count, hashed. Check recomputes
// the fingerprints on a release; a difference fails the drift test (go
// test ./internal/drift) and is listed, with upstream's diff, by
// scripts/rebase. After reviewing the change and bringing our counterpart
// in step, a maintainer records the new fingerprints with
// `scripts/drift --accept`.
package drift

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/amqp091-drainer/amqp091-drainer/internal/overlaynames"
	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
)

// Guard is one upstream function whose logic the overlay carries a version
// of.
type Guard struct {
	Upstream    string   // "Channel.dispatch" for a method, "dispatchClosed" for a function
	Ours        []string // our counterparts, "drainer_dispatch.go:dispatchMessage"
	Fingerprint string   // "sha256:…" of upstream's normalised text at the pinned release
}

// Fingerprint hashes a function's normalised text.
func Fingerprint(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Parse reads guards.txt: one guard a line, "Upstream Ours[,Ours…]
// Fingerprint"; blank lines and lines starting with # are comments.
func Parse(data []byte) ([]Guard, error) {
	var guards []Guard
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[2], "sha256:") {
			return nil, fmt.Errorf("guards line %d: want \"UpstreamName file.go:ourName[,…] sha256:…\", got %q", n, line)
		}
		if seen[f[0]] {
			return nil, fmt.Errorf("guards line %d: %s is guarded twice", n, f[0])
		}
		seen[f[0]] = true
		guards = append(guards, Guard{Upstream: f[0], Ours: strings.Split(f[1], ","), Fingerprint: f[2]})
	}
	return guards, sc.Err()
}

// Format writes guards in Parse's format under header, a comment block
// (each line already starting with #), aligned in columns.
func Format(header string, guards []Guard) []byte {
	var b bytes.Buffer
	b.WriteString(header)
	w0, w1 := 0, 0
	for _, g := range guards {
		w0 = max(w0, len(g.Upstream))
		w1 = max(w1, len(strings.Join(g.Ours, ",")))
	}
	for _, g := range guards {
		fmt.Fprintf(&b, "%-*s  %-*s  %s\n", w0, g.Upstream, w1, strings.Join(g.Ours, ","), g.Fingerprint)
	}
	return b.Bytes()
}

// Header returns the comment block at the top of guards.txt, to keep it
// when Format writes the file again.
func Header(data []byte) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if !strings.HasPrefix(line, "#") {
			break
		}
		b.WriteString(line)
	}
	return b.String()
}

// Funcs maps each function and method a package declares (overlaynames'
// "function" and "method" names, e.g. "Channel.dispatch") to its
// normalised text.
func Funcs(dir string) (map[string]string, error) {
	decls, err := overlaynames.Declared(dir)
	if err != nil {
		return nil, err
	}
	funcs := map[string]string{}
	for n, text := range decls {
		if n.Kind == overlaynames.KindFunc || n.Kind == overlaynames.KindMethod {
			funcs[n.Name] = text
		}
	}
	return funcs, nil
}

// Finding is a guard whose upstream function is not what its fingerprint
// recorded, or whose counterpart is gone from the overlay.
type Finding struct {
	Guard   Guard
	Version string // the release checked
	Now     string // the fingerprint now; "" when upstream no longer has the function
	Missing string // a counterpart the overlay no longer declares
}

func (f Finding) Error() string {
	ours := strings.Join(f.Guard.Ours, ", ")
	switch {
	case f.Missing != "":
		return fmt.Sprintf("guard %s names our counterpart %s, which the overlay no longer declares: "+
			"fix the line in upstream/guards.txt (the counterpart was renamed or moved?)", f.Guard.Upstream, f.Missing)
	case f.Now == "":
		return fmt.Sprintf("upstream's %s is gone at %s, and our %s carries a version of it: "+
			"find what replaced it, bring ours in step, then update upstream/guards.txt", f.Guard.Upstream, f.Version, ours)
	default:
		return fmt.Sprintf("upstream's %s changed at %s (fingerprint %s recorded, %s now), and our %s carries a version of it: "+
			"read upstream's change (scripts/rebase prints it), bring ours in step, then record the new fingerprint with scripts/drift --accept",
			f.Guard.Upstream, f.Version, short(f.Guard.Fingerprint), short(f.Now), ours)
	}
}

func short(fp string) string {
	if len(fp) > len("sha256:")+12 {
		return fp[:len("sha256:")+12]
	}
	return fp
}

// Check compares every guard's fingerprint with upstream's functions of
// release version (Funcs of its pristine tree), and checks that every
// counterpart is still declared in the overlay file it names (overlay maps
// the overlay's file names to their text).
func Check(guards []Guard, version string, upstream map[string]string, overlay map[string][]byte) []Finding {
	var found []Finding
	for _, g := range guards {
		for _, o := range g.Ours {
			if !declares(overlay, o) {
				found = append(found, Finding{Guard: g, Version: version, Now: g.Fingerprint, Missing: o})
			}
		}
		text, ok := upstream[g.Upstream]
		now := ""
		if ok {
			now = Fingerprint(text)
		}
		if now != g.Fingerprint {
			found = append(found, Finding{Guard: g, Version: version, Now: now})
		}
	}
	return found
}

// declares reports whether the overlay file named in counterpart
// ("file.go:name" or "file.go:Type.method") declares that function.
func declares(overlay map[string][]byte, counterpart string) bool {
	file, name, ok := strings.Cut(counterpart, ":")
	src, found := overlay[file]
	if !ok || !found {
		return false
	}
	pattern := `(?m)^func ` + regexp.QuoteMeta(name) + `[\[(]`
	if typ, method, isMethod := strings.Cut(name, "."); isMethod {
		pattern = `(?m)^func \(\w+ \*?` + regexp.QuoteMeta(typ) + `(\[[^]]*\])?\) ` + regexp.QuoteMeta(method) + `[\[(]`
	}
	return regexp.MustCompile(pattern).Match(src)
}

// Accept returns guards with every fingerprint recomputed from upstream,
// sorted as given. A guard whose function upstream no longer has is an
// error: it needs a maintainer's edit, not a new hash.
func Accept(guards []Guard, upstream map[string]string) ([]Guard, error) {
	out := make([]Guard, len(guards))
	var gone []string
	for i, g := range guards {
		text, ok := upstream[g.Upstream]
		if !ok {
			gone = append(gone, g.Upstream)
			continue
		}
		g.Fingerprint = Fingerprint(text)
		out[i] = g
	}
	if len(gone) > 0 {
		sort.Strings(gone)
		return nil, fmt.Errorf("upstream no longer declares %s: edit upstream/guards.txt by hand", strings.Join(gone, ", "))
	}
	return out, nil
}

// Pinned checks the guards of the checkout at root against the release
// its upstream/PIN names, fetched and verified as `make vendor` does.
func Pinned(ctx context.Context, root string) (version string, guards []Guard, found []Finding, err error) {
	pin, err := upstreamtree.ReadPin(root)
	if err != nil {
		return "", nil, nil, err
	}
	data, err := os.ReadFile(GuardsFile(root))
	if err != nil {
		return "", nil, nil, err
	}
	if guards, err = Parse(data); err != nil {
		return "", nil, nil, err
	}
	upstream, err := PristineFuncs(ctx, pin)
	if err != nil {
		return "", nil, nil, err
	}
	overlay, err := OverlayFiles(root)
	if err != nil {
		return "", nil, nil, err
	}
	return pin.Version, guards, Check(guards, pin.Version, upstream, overlay), nil
}

// AcceptPinned records, in the checkout at root, the fingerprints of the
// release its upstream/PIN names.
func AcceptPinned(ctx context.Context, root string) error {
	pin, err := upstreamtree.ReadPin(root)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(GuardsFile(root))
	if err != nil {
		return err
	}
	guards, err := Parse(data)
	if err != nil {
		return err
	}
	upstream, err := PristineFuncs(ctx, pin)
	if err != nil {
		return err
	}
	accepted, err := Accept(guards, upstream)
	if err != nil {
		return err
	}
	return os.WriteFile(GuardsFile(root), Format(Header(data), accepted), 0o644)
}

// GuardsFile is where the checkout at root keeps its guards.
func GuardsFile(root string) string { return filepath.Join(root, "upstream", "guards.txt") }

// PristineFuncs fetches and verifies the release pin names, and returns
// Funcs of its tree.
func PristineFuncs(ctx context.Context, pin upstreamtree.Pin) (map[string]string, error) {
	scratch, err := os.MkdirTemp("", "amqp091-drift-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	dir := filepath.Join(scratch, "tree")
	if err := upstreamtree.Pristine(ctx, pin, dir); err != nil {
		return nil, err
	}
	return Funcs(dir)
}

// OverlayFiles maps the name of each overlay file of the checkout at root
// to its text.
func OverlayFiles(root string) (map[string][]byte, error) {
	names, err := filepath.Glob(filepath.Join(root, "upstream", "_overlay", "*.go"))
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out[filepath.Base(n)] = data
	}
	return out, nil
}
