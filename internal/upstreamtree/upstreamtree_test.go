package upstreamtree

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/upstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func realSources(t *testing.T) Sources {
	t.Helper()
	pin, err := ParsePin(upstream.Pin())
	if err != nil {
		t.Fatalf("ParsePin(upstream/PIN): %v", err)
	}
	src := Sources{Pin: pin}
	for _, f := range upstream.Patches() {
		src.Patches = append(src.Patches, File(f))
	}
	for _, f := range upstream.Overlay() {
		src.Overlay = append(src.Overlay, File(f))
	}
	return src
}

func TestParsePin(t *testing.T) {
	pin, err := ParsePin([]byte("# comment\n\ngithub.com/rabbitmq/amqp091-go v1.16.0 h1:abc=\n"))
	if err != nil {
		t.Fatal(err)
	}
	if pin.Path != "github.com/rabbitmq/amqp091-go" || pin.Version != "v1.16.0" || pin.Hash != "h1:abc=" {
		t.Fatalf("ParsePin = %+v", pin)
	}
	for _, bad := range []string{
		"",
		"github.com/rabbitmq/amqp091-go v1.16.0",
		"github.com/rabbitmq/amqp091-go v1.16.0 sha256:abc",
		"github.com/rabbitmq/amqp091-go notaversion h1:abc=",
		"a.example/x v1.0.0 h1:a=\nb.example/y v1.0.0 h1:b=",
	} {
		if _, err := ParsePin([]byte(bad)); err == nil {
			t.Errorf("ParsePin(%q) succeeded, want an error", bad)
		}
	}
}

// TestCorruptedPinIsRefused is the guard against a tampered or mistyped pin:
// the proxy's zip must hash to exactly the pinned value.
func TestCorruptedPinIsRefused(t *testing.T) {
	src := realSources(t)
	src.Pin.Hash = "h1:" + strings.Repeat("A", 43) + "="
	dir := filepath.Join(t.TempDir(), "amqp091-go")
	_, err := Build(context.Background(), src, dir)
	var mismatch *HashMismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("Build with a corrupted pin = %v, want a HashMismatchError", err)
	}
	if !strings.Contains(err.Error(), "refusing to vendor") || !strings.Contains(err.Error(), src.Pin.Hash) {
		t.Fatalf("error does not say what was refused and why: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("a refused build left %s behind", dir)
	}
}

func TestBuildIsReproducibleAndStamped(t *testing.T) {
	ctx := context.Background()
	src := realSources(t)
	dir := filepath.Join(t.TempDir(), "amqp091-go")

	res, err := Build(ctx, src, dir)
	if err != nil {
		t.Fatalf("first Build: %v", err)
	}
	if !res.Rebuilt {
		t.Fatal("first Build did not build")
	}
	for _, f := range src.Overlay {
		if _, err := os.Stat(filepath.Join(dir, f.Name)); err != nil {
			t.Errorf("overlay file missing: %v", err)
		}
	}
	if res, err = Build(ctx, src, dir); err != nil || res.Rebuilt {
		t.Fatalf("second Build = (rebuilt %v, %v), want a no-op", res.Rebuilt, err)
	}

	// Any changed input rebuilds.
	changed := src
	changed.Overlay = append(append([]File(nil), src.Overlay...), File{Name: "zz_extra.go", Data: []byte("package amqp091\n")})
	if res, err = Build(ctx, changed, dir); err != nil || !res.Rebuilt {
		t.Fatalf("Build after an overlay change = (rebuilt %v, %v), want a rebuild", res.Rebuilt, err)
	}
	// A hand-edited tree rebuilds too.
	if err := os.WriteFile(filepath.Join(dir, "doc.go"), []byte("package amqp091\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err = Build(ctx, changed, dir); err != nil || !res.Rebuilt {
		t.Fatalf("Build after a hand edit = (rebuilt %v, %v), want a rebuild", res.Rebuilt, err)
	}
}

func TestFailingHunkIsNamed(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "a.go"), []byte("package a\n\nfunc one() {}\n\nfunc two() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	patch := `diff --git a/a.go b/a.go
--- a/a.go
+++ b/a.go
@@ -1,3 +1,3 @@
 package a
 
-func one() {}
+func uno() {}
@@ -5,1 +5,1 @@
-func three() {}
+func tres() {}
`
	err := applyPatch(root, File{Name: "0009-example.patch", Data: []byte(patch)})
	var perr *PatchError
	if !errors.As(err, &perr) {
		t.Fatalf("applyPatch = %v, want a PatchError", err)
	}
	if perr.Patch != "0009-example.patch" || perr.File != "a.go" || perr.Hunk != 2 {
		t.Fatalf("PatchError = %+v, want patch 0009-example.patch, file a.go, hunk 2", perr)
	}
	for _, want := range []string{"0009-example.patch", "a.go", "hunk 2", "@@ -5,1 +5,1 @@"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestPatchCanAddAndDeleteFiles(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "old.go"), []byte("package a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	patch := `diff --git a/old.go b/old.go
deleted file mode 100644
--- a/old.go
+++ /dev/null
@@ -1 +0,0 @@
-package a
diff --git a/new.go b/new.go
new file mode 100644
--- /dev/null
+++ b/new.go
@@ -0,0 +1 @@
+package a
`
	if err := applyPatch(root, File{Name: "p.patch", Data: []byte(patch)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "old.go")); !os.IsNotExist(err) {
		t.Error("old.go still exists")
	}
	if data, err := os.ReadFile(filepath.Join(root, "new.go")); err != nil || string(data) != "package a\n" {
		t.Errorf("new.go = %q, %v", data, err)
	}
}

func TestOverlayMayNotReplaceUpstreamFiles(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "channel.go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := addOverlay(root, File{Name: "channel.go", Data: []byte("x")}); err == nil {
		t.Fatal("an overlay file replaced an upstream file")
	}
	if err := addOverlay(root, File{Name: "../escape.go", Data: []byte("x")}); err == nil {
		t.Fatal("an overlay file name left the tree")
	}
}
