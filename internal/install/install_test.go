package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/mod/modfile"

	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const amqpPath = "github.com/rabbitmq/amqp091-go"

// buildTimeout bounds one Install: the pinned zip comes from the module
// cache, or the proxy on a cold cache.
const buildTimeout = 3 * time.Minute

// newModule writes a go.mod in a fresh folder and returns the folder. The
// file is in modfile's canonical format, so that byte comparisons after an
// install and an uninstall are meaningful, and carries a comment and an
// unrelated requirement that must survive both.
func newModule(t *testing.T, amqpVersion string) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("// A user's module.\nmodule example.com/user\n\ngo 1.22\n\nrequire (\n")
	if amqpVersion != "" {
		b.WriteString("\t" + amqpPath + " " + amqpVersion + "\n")
	}
	b.WriteString("\tgolang.org/x/mod v0.43.0 // keep me\n)\n")
	writeFile(t, filepath.Join(dir, "go.mod"), b.String())
	return dir
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func parseGoMod(t *testing.T, dir string) *modfile.File {
	t.Helper()
	path := filepath.Join(dir, "go.mod")
	f, err := modfile.Parse(path, readFile(t, path), nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func required(f *modfile.File, path string) string {
	for _, r := range f.Require {
		if r.Mod.Path == path {
			return r.Mod.Version
		}
	}
	return ""
}

func replaces(f *modfile.File, path string) []*modfile.Replace {
	var out []*modfile.Replace
	for _, r := range f.Replace {
		if r.Old.Path == path {
			out = append(out, r)
		}
	}
	return out
}

func pinned(t *testing.T) upstreamtree.Pin {
	t.Helper()
	src, err := Sources()
	if err != nil {
		t.Fatal(err)
	}
	if src.Pin.Path != amqpPath {
		t.Fatalf("pin is for %s, want %s", src.Pin.Path, amqpPath)
	}
	return src.Pin
}

func install(t *testing.T, opts Options) (*Report, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	var out bytes.Buffer
	opts.Out = &out
	start := time.Now()
	rep, err := Install(ctx, opts)
	if err != nil {
		t.Fatalf("Install: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("Install (%v):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	checkPrinted(t, rep, out.String())
	return rep, out.String()
}

func uninstall(t *testing.T, opts Options) (*Report, string) {
	t.Helper()
	var out bytes.Buffer
	opts.Out = &out
	rep, err := Uninstall(context.Background(), opts)
	if err != nil {
		t.Fatalf("Uninstall: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("Uninstall:\n%s", out.String())
	checkPrinted(t, rep, out.String())
	return rep, out.String()
}

// checkPrinted holds the report to its promise: Actions are exactly the
// lines printed.
func checkPrinted(t *testing.T, rep *Report, out string) {
	t.Helper()
	if got := strings.Join(rep.Actions, "\n") + "\n"; got != out {
		t.Errorf("Actions do not match the output:\nActions:\n%s\noutput:\n%s", got, out)
	}
}

func TestInstallRefusesModuleWithoutRequirement(t *testing.T) {
	t.Parallel()
	pin := pinned(t)
	dir := newModule(t, "")
	before := readFile(t, filepath.Join(dir, "go.mod"))

	var out bytes.Buffer
	_, err := Install(context.Background(), Options{Module: dir, Out: &out})
	var nre *NotRequiredError
	if !errors.As(err, &nre) {
		t.Fatalf("Install: got %v, want a *NotRequiredError", err)
	}
	for _, want := range []string{
		"module example.com/user",
		"does not require " + amqpPath,
		"nothing to patch",
		"go get " + amqpPath + "@" + pin.Version,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if !bytes.Equal(readFile(t, filepath.Join(dir, "go.mod")), before) {
		t.Error("go.mod changed")
	}
	if _, err := os.Stat(filepath.Join(dir, "third_party")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("third_party exists after a refusal: %v", err)
	}
	if out.Len() != 0 {
		t.Errorf("printed on refusal:\n%s", out.String())
	}
}

func TestInstallOtherVersionWarnsAndSetsPinnedVersion(t *testing.T) {
	t.Parallel()
	pin := pinned(t)
	// A pseudo-version after the pinned release: its next patch release, at
	// a commit before it.
	major, minor, patch := 0, 0, 0
	if _, err := fmt.Sscanf(pin.Version, "v%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("pin %s: %v", pin.Version, err)
	}
	after := fmt.Sprintf("v%d.%d.%d-0.20250101000000-abcdefabcdef", major, minor, patch+1)
	for _, tc := range []struct{ version, direction string }{
		{"v1.10.0", "an upgrade"},
		{"v1.16.0", "an upgrade"}, // the release pinned before v1.17.0
		{"v1.99.0", "a downgrade"},
		{after, "a downgrade"},
	} {
		t.Run(tc.version, func(t *testing.T) {
			t.Parallel()
			dir := newModule(t, tc.version)
			rep, out := install(t, Options{Module: dir})

			if rep.Required != tc.version || rep.Version != pin.Version {
				t.Errorf("Report: Required %q Version %q, want %q %q", rep.Required, rep.Version, tc.version, pin.Version)
			}
			if got := required(parseGoMod(t, dir), amqpPath); got != pin.Version {
				t.Errorf("go.mod requires %s %s, want %s", amqpPath, got, pin.Version)
			}
			if len(rep.Warnings) != 1 {
				t.Fatalf("Warnings = %q, want one", rep.Warnings)
			}
			for _, want := range []string{
				"required " + amqpPath + " " + tc.version,
				"the patched build is " + pin.Version,
				"the requirement is now " + pin.Version,
				tc.direction,
				"check that your code builds",
			} {
				if !strings.Contains(rep.Warnings[0], want) {
					t.Errorf("warning %q does not say %q", rep.Warnings[0], want)
				}
			}
			for _, want := range []string{
				"warning: " + rep.Warnings[0],
				"go.mod: require " + amqpPath + " " + tc.version + " -> " + pin.Version,
			} {
				if !strings.Contains(out, want+"\n") {
					t.Errorf("output does not have the line %q:\n%s", want, out)
				}
			}
		})
	}
}

func TestInstallWritesReplaceAndTree(t *testing.T) {
	t.Parallel()
	pin := pinned(t)
	dir := newModule(t, pin.Version)
	rep, out := install(t, Options{Module: dir})

	f := parseGoMod(t, dir)
	rs := replaces(f, amqpPath)
	if len(rs) != 1 || rs[0].Old.Version != "" || rs[0].New.Path != "./third_party/amqp091-go" || rs[0].New.Version != "" {
		t.Fatalf("go.mod replaces: %+v, want one `%s => ./third_party/amqp091-go`", rs, amqpPath)
	}
	if got := required(f, amqpPath); got != pin.Version {
		t.Errorf("requirement changed to %q", got)
	}
	if got := required(f, "golang.org/x/mod"); got != "v0.43.0" {
		t.Errorf("unrelated requirement lost: %q", got)
	}
	if data := string(readFile(t, filepath.Join(dir, "go.mod"))); !strings.Contains(data, "// A user's module.") || !strings.Contains(data, "// keep me") {
		t.Errorf("comments lost:\n%s", data)
	}

	tree := filepath.Join(dir, "third_party", "amqp091-go")
	for _, name := range []string{"go.mod", "connection.go", "readpath.go", "drainer.go", upstreamtree.StampFile} {
		if _, err := os.Stat(filepath.Join(tree, name)); err != nil {
			t.Errorf("tree: %v", err)
		}
	}
	if modData := readFile(t, filepath.Join(tree, "go.mod")); !bytes.HasPrefix(modData, []byte("module "+amqpPath+"\n")) {
		t.Errorf("tree go.mod starts %q", modData[:min(len(modData), 60)])
	}
	if !rep.Rebuilt || !rep.GoModWritten || !rep.Changed() || len(rep.Warnings) != 0 {
		t.Errorf("Report: Rebuilt %v GoModWritten %v Changed %v Warnings %q", rep.Rebuilt, rep.GoModWritten, rep.Changed(), rep.Warnings)
	}
	if !samePath(rep.Dir, tree) || rep.Replacement != "./third_party/amqp091-go" {
		t.Errorf("Report: Dir %q Replacement %q", rep.Dir, rep.Replacement)
	}
	for _, want := range []string{
		"vendored: built third_party/amqp091-go from " + amqpPath + "@" + pin.Version + " (hash verified)",
		"go.mod: require " + amqpPath + " " + pin.Version + " already in place",
		"go.mod: added replace " + amqpPath + " => ./third_party/amqp091-go",
		"go.mod: wrote ",
		"next: run `go mod tidy`",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
	// Build's scratch folders must not be left next to the tree.
	entries, err := os.ReadDir(filepath.Join(dir, "third_party"))
	if err != nil || len(entries) != 1 {
		t.Errorf("third_party holds %v (%v), want only amqp091-go", entries, err)
	}
}

func TestSecondInstallIsNoOp(t *testing.T) {
	t.Parallel()
	dir := newModule(t, "v1.10.0")
	install(t, Options{Module: dir})
	goMod := filepath.Join(dir, "go.mod")
	before := readFile(t, goMod)
	fi, err := os.Stat(goMod)
	if err != nil {
		t.Fatal(err)
	}

	rep, out := install(t, Options{Module: dir})
	if after := readFile(t, goMod); !bytes.Equal(after, before) {
		t.Errorf("go.mod changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if fi2, err := os.Stat(goMod); err != nil || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Errorf("go.mod was rewritten (mtime %v -> %v, %v)", fi.ModTime(), fi2.ModTime(), err)
	}
	if rep.Rebuilt || rep.GoModWritten || rep.Changed() || len(rep.Warnings) != 0 {
		t.Errorf("Report: Rebuilt %v GoModWritten %v Changed %v Warnings %q", rep.Rebuilt, rep.GoModWritten, rep.Changed(), rep.Warnings)
	}
	for _, want := range []string{
		"vendored: third_party/amqp091-go is up to date",
		"already in place",
		"install: everything is already in place; nothing written",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "wrote") || strings.Contains(out, "warning") {
		t.Errorf("second run reports a write or a warning:\n%s", out)
	}
}

func TestUninstallReverts(t *testing.T) {
	t.Parallel()
	pin := pinned(t)
	dir := newModule(t, pin.Version)
	goMod := filepath.Join(dir, "go.mod")
	original := readFile(t, goMod)
	install(t, Options{Module: dir})

	// From a subfolder: the module root is found by walking up.
	sub := filepath.Join(dir, "cmd", "app")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	rep, out := uninstall(t, Options{Module: sub})

	f := parseGoMod(t, dir)
	if rs := replaces(f, amqpPath); len(rs) != 0 {
		t.Errorf("go.mod still replaces %s: %+v", amqpPath, rs)
	}
	if got := required(f, amqpPath); got != pin.Version {
		t.Errorf("requirement is %q after uninstall, want it left at %s", got, pin.Version)
	}
	// modfile's add and drop leave the file as it was.
	if after := readFile(t, goMod); !bytes.Equal(after, original) {
		t.Errorf("go.mod after install+uninstall:\n%s\nwant the original:\n%s", after, original)
	}
	if _, err := os.Stat(filepath.Join(dir, "third_party")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("third_party still exists: %v", err)
	}
	if !rep.Removed || !rep.GoModWritten {
		t.Errorf("Report: Removed %v GoModWritten %v", rep.Removed, rep.GoModWritten)
	}
	for _, want := range []string{
		"go.mod: dropped replace " + amqpPath + " => ./third_party/amqp091-go",
		"removed third_party/amqp091-go",
		"removed third_party, now empty",
		"the requirement stays at " + amqpPath + " " + pin.Version,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
}

func TestUninstallOnCleanModuleHasNothingToUndo(t *testing.T) {
	t.Parallel()
	dir := newModule(t, "v1.16.0")
	before := readFile(t, filepath.Join(dir, "go.mod"))
	rep, out := uninstall(t, Options{Module: dir})
	if rep.Changed() {
		t.Errorf("Report says something changed: %+v", rep)
	}
	if !strings.Contains(out, "uninstall: nothing to undo") || len(rep.Actions) != 1 {
		t.Errorf("output:\n%s\nwant one line saying there is nothing to undo", out)
	}
	if !bytes.Equal(readFile(t, filepath.Join(dir, "go.mod")), before) {
		t.Error("go.mod changed")
	}
}

func TestInstallCustomDirAndUninstallFindsIt(t *testing.T) {
	t.Parallel()
	dir := newModule(t, "v1.16.0")
	rep, _ := install(t, Options{Module: dir, Dir: "deps/amqp"})
	if rep.Replacement != "./deps/amqp" {
		t.Errorf("Replacement %q, want ./deps/amqp", rep.Replacement)
	}
	if rs := replaces(parseGoMod(t, dir), amqpPath); len(rs) != 1 || rs[0].New.Path != "./deps/amqp" {
		t.Fatalf("go.mod replaces: %+v", rs)
	}
	// Without -dir, uninstall recognises the tree by its stamp.
	rep, out := uninstall(t, Options{Module: dir})
	if !rep.Removed || !rep.GoModWritten || len(replaces(parseGoMod(t, dir), amqpPath)) != 0 {
		t.Errorf("uninstall did not undo a -dir install:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "deps")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("deps still exists: %v", err)
	}
}

func TestInstallRefusesForeignReplace(t *testing.T) {
	t.Parallel()
	dir := newModule(t, "v1.16.0")
	goMod := filepath.Join(dir, "go.mod")
	writeFile(t, goMod, string(readFile(t, goMod))+"\nreplace "+amqpPath+" => github.com/someone/amqp091-go v1.16.1\n")
	before := readFile(t, goMod)

	_, err := Install(context.Background(), Options{Module: dir})
	if err == nil || !strings.Contains(err.Error(), "already has `replace "+amqpPath+" => github.com/someone/amqp091-go v1.16.1`") ||
		!strings.Contains(err.Error(), "-dropreplace") {
		t.Fatalf("Install: got %v, want a refusal naming the existing replace", err)
	}
	if !bytes.Equal(readFile(t, goMod), before) {
		t.Error("go.mod changed")
	}

	// Uninstall leaves it alone too, and says so.
	rep, out := uninstall(t, Options{Module: dir})
	if rep.Changed() || len(rep.Warnings) != 1 || !strings.Contains(out, "did not add; left alone") {
		t.Errorf("uninstall on a foreign replace:\n%s", out)
	}
	if !bytes.Equal(readFile(t, goMod), before) {
		t.Error("go.mod changed")
	}
}

func TestInstallRefusesForeignFolder(t *testing.T) {
	t.Parallel()
	dir := newModule(t, "v1.16.0")
	mine := filepath.Join(dir, "third_party", "amqp091-go", "mine.go")
	writeFile(t, mine, "package mine\n")
	before := readFile(t, filepath.Join(dir, "go.mod"))

	_, err := Install(context.Background(), Options{Module: dir})
	if err == nil || !strings.Contains(err.Error(), "was not written by amqp091-drainer") {
		t.Fatalf("Install: got %v, want a refusal to replace a foreign folder", err)
	}
	if _, err := os.Stat(mine); err != nil {
		t.Errorf("the user's file is gone: %v", err)
	}
	if !bytes.Equal(readFile(t, filepath.Join(dir, "go.mod")), before) {
		t.Error("go.mod changed")
	}
	rep, _ := uninstall(t, Options{Module: dir})
	if _, err := os.Stat(mine); err != nil || rep.Removed || len(rep.Warnings) != 1 {
		t.Errorf("uninstall touched a foreign folder: %v, Removed %v, Warnings %q", err, rep.Removed, rep.Warnings)
	}
}

func TestInstallRefusesDirAtOrAboveModule(t *testing.T) {
	t.Parallel()
	dir := newModule(t, "v1.16.0")
	for _, d := range []string{".", "..", dir} {
		if _, err := Install(context.Background(), Options{Module: dir, Dir: d}); err == nil || !strings.Contains(err.Error(), "module root or above it") {
			t.Errorf("-dir %s: got %v", d, err)
		}
	}
}

func TestFindGoMod(t *testing.T) {
	t.Parallel()
	dir := newModule(t, "v1.16.0")
	sub := filepath.Join(dir, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := FindGoMod(sub)
	if err != nil || !samePath(filepath.Dir(got), dir) {
		t.Errorf("FindGoMod(%s) = %q, %v; want %s/go.mod", sub, got, err, dir)
	}
	if _, err := FindGoMod(filepath.Join(dir, "missing")); err == nil {
		t.Error("FindGoMod on a missing folder: no error")
	}
}
