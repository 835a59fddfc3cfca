package rebase

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
)

const checkout = "../.."

func pinned(t *testing.T, root string) upstreamtree.Pin {
	t.Helper()
	pin, err := upstreamtree.ReadPin(root)
	if err != nil {
		t.Fatal(err)
	}
	return pin
}

// TestRebaseOntoThePinReproducesThePatches keeps the committed patch files
// exactly what scripts/rebase writes: a hand-edited patch (a stale index
// line, a hunk count off) fails here, not in the next release's rebase.
func TestRebaseOntoThePinReproducesThePatches(t *testing.T) {
	pin := pinned(t, checkout)
	rep := Run(context.Background(), Options{Root: checkout, Version: pin.Version, DryRun: true, Log: io.Discard})
	var out bytes.Buffer
	rep.Print(&out)
	if rep.Err != nil || !rep.Applied() {
		t.Fatalf("rebase onto the pinned %s itself failed:\n%s", pin.Version, out.String())
	}
	for _, h := range rep.Hunks {
		if h.Status != Exact {
			t.Errorf("%s %s hunk %d: %v onto the pinned release itself", h.Patch, h.File, h.Index, h.Status)
		}
	}
	for _, p := range rep.Patches {
		if !p.Same {
			t.Errorf("%s is not what scripts/rebase writes (%s): run scripts/rebase %s", p.Name, p.Changed, pin.Version)
		}
	}
	if len(rep.Drift) != 0 {
		t.Errorf("drift against the pinned release itself:\n%s", out.String())
	}
}

// TestReleaseThatDoesNotApplyChangesNothing rebases a copy of the
// checkout's inputs onto v1.10.0, which predates what the patches hook, and
// expects a report of the conflicts, both sides shown, and no file changed.
func TestReleaseThatDoesNotApplyChangesNothing(t *testing.T) {
	root := t.TempDir()
	inputs := []string{"upstream/PIN", "upstream/guards.txt", "PATCHES.md"}
	for _, dir := range []string{"upstream/patches", "upstream/_overlay"} {
		entries, err := os.ReadDir(filepath.Join(checkout, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			inputs = append(inputs, dir+"/"+e.Name())
		}
	}
	before := map[string][]byte{}
	for _, f := range inputs {
		data, err := os.ReadFile(filepath.Join(checkout, f))
		if err != nil {
			t.Fatal(err)
		}
		before[f] = data
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep := Run(context.Background(), Options{Root: root, Version: "v1.10.0", Log: io.Discard})
	var out bytes.Buffer
	rep.Print(&out)
	report := out.String()
	if rep.Err != nil || rep.Applied() || rep.OK() {
		t.Fatalf("want a report of conflicts, got err=%v applied=%v:\n%s", rep.Err, rep.Applied(), report)
	}
	for _, want := range []string{"CONFLICT", "<<<<<<< channel.go patched at", ">>>>>>> channel.go at v1.10.0", "v1.10.0 does not apply; nothing was written"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if len(rep.Written) != 0 {
		t.Errorf("a release that does not apply wrote %v", rep.Written)
	}
	for _, f := range inputs {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil || !bytes.Equal(data, before[f]) {
			t.Errorf("%s changed (err %v)", f, err)
		}
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 2 { // upstream/ and PATCHES.md
		t.Errorf("the rebase left new files in the checkout: %v", entries)
	}
}
