package rebase

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// onePatch parses a one-file unified diff.
func onePatch(t *testing.T, diff string) *gitdiff.File {
	t.Helper()
	files, _, err := gitdiff.Parse(strings.NewReader(diff))
	if err != nil || len(files) != 1 {
		t.Fatalf("parse: %v (%d files)", err, len(files))
	}
	return files[0]
}

const twoHunks = `diff --git a/f.go b/f.go
--- a/f.go
+++ b/f.go
@@ -2,3 +2,3 @@
 b
-c
+C
 d
@@ -8,3 +8,4 @@
 h
 i
+I
 j
`

func numbered(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

var base = numbered("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k")

func TestPlaceExact(t *testing.T) {
	out, hunks, ok := place("p", onePatch(t, twoHunks), base)
	if !ok {
		t.Fatalf("not placed: %+v", hunks)
	}
	if want := numbered("a", "b", "C", "d", "e", "f", "g", "h", "i", "I", "j", "k"); out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	for _, h := range hunks {
		if h.Status != Exact || h.Offset != 0 {
			t.Errorf("hunk %d: %v %+d, want exact", h.Index, h.Status, h.Offset)
		}
	}
}

func TestPlaceMoved(t *testing.T) {
	// Three lines inserted at the top, one removed between the hunks: the
	// first hunk moves by +3, the second by +2, and both still apply.
	src := numbered("x", "y", "z", "a", "b", "c", "d", "e", "g", "h", "i", "j", "k")
	out, hunks, ok := place("p", onePatch(t, twoHunks), src)
	if !ok {
		t.Fatalf("not placed: %+v", hunks)
	}
	if want := numbered("x", "y", "z", "a", "b", "C", "d", "e", "g", "h", "i", "I", "j", "k"); out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	if hunks[0].Status != Moved || hunks[0].Offset != 3 || hunks[1].Status != Moved || hunks[1].Offset != 2 {
		t.Fatalf("got %+v, want moved +3 and +2", hunks)
	}
}

func TestPlaceNeverFuzzes(t *testing.T) {
	// One context line of the second hunk changed: GNU patch would apply
	// it with fuzz 1; a rebase must not.
	src := numbered("a", "b", "c", "d", "e", "f", "g", "h", "i", "J", "k")
	_, hunks, ok := place("p", onePatch(t, twoHunks), src)
	if ok || hunks[0].Status != Exact || hunks[1].Status != Conflict {
		t.Fatalf("got ok=%v %+v, want the second hunk unplaced", ok, hunks)
	}
}

func TestPlacePrefersTheNearestMatch(t *testing.T) {
	// The first hunk's old side stands twice; the one nearer to where the
	// patch recorded it wins, as GNU patch chooses.
	src := numbered("x", "y", "z", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "b", "c", "d")
	_, hunks, ok := place("p", onePatch(t, twoHunks), src)
	if !ok || hunks[0].Offset != 3 || hunks[1].Offset != 3 {
		t.Fatalf("got ok=%v %+v, want both hunks moved +3", ok, hunks)
	}
}

func TestMerge3(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is needed to rebase (git merge-file, git format-patch): install git")
	}
	ctx := context.Background()
	scratch := t.TempDir()
	// The patch changes c; the release changed b, the first hunk's
	// context: no placing, but a clean merge.
	ours := numbered("a", "b", "x", "C", "d")
	baseText := numbered("a", "b", "x", "c", "d")
	theirs := numbered("a", "B", "x", "c", "d")
	merged, conflicts, err := merge3(ctx, scratch, "f.go", baseText, ours, theirs, "v1", "v2")
	if err != nil || len(conflicts) != 0 {
		t.Fatalf("merge: %v, conflicts %q", err, conflicts)
	}
	if want := numbered("a", "B", "x", "C", "d"); merged != want {
		t.Fatalf("got\n%s\nwant\n%s", merged, want)
	}
	// The release changed c itself: a conflict, both sides shown.
	_, conflicts, err = merge3(ctx, scratch, "f.go", baseText, ours, numbered("a", "b", "x", "c2", "d"), "v1", "v2")
	if err != nil || len(conflicts) != 1 {
		t.Fatalf("merge: %v, conflicts %q", err, conflicts)
	}
	for _, want := range []string{"<<<<<<< f.go patched at v1", "C\n", "||||||| f.go at v1", "c2\n", ">>>>>>> f.go at v2"} {
		if !strings.Contains(conflicts[0], want) {
			t.Errorf("conflict lacks %q:\n%s", want, conflicts[0])
		}
	}
	entries, _ := os.ReadDir(scratch)
	if len(entries) != 0 {
		t.Errorf("merge left %d entries in its scratch folder", len(entries))
	}
}
