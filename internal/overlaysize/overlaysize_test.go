package overlaysize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMeasure(t *testing.T) {
	dir := t.TempDir()
	long := "func long() {\n" + strings.Repeat("\t_ = 1\n", MaxFuncLines) + "}\n"
	src := `// Package p is a test.
package p

/* a block
   comment */

// T is a type.
type T struct {
	A int // trailing comments count as code
}

func (t *T) short() {}

` + long + "\nfunc appendField() {\n" + strings.Repeat("\t_ = 2\n", MaxFuncLines) + "}\n"
	write(t, dir, "p.go", src)
	write(t, dir, "p_test.go", "package p\n\n// x\nfunc TestX() {}\n")

	r, err := Measure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Code.Files != 1 || r.Tests.Files != 1 || r.Tests.NonBlank != 3 || r.Tests.Total != 4 {
		t.Errorf("files: code %+v tests %+v", r.Code, r.Tests)
	}
	if r.Code.Comment != 4 {
		t.Errorf("comment lines = %d, want 4 (the package doc, the block comment's two lines, T's doc)", r.Code.Comment)
	}
	if want := strings.Count(src, "\n"); r.Code.Total != want {
		t.Errorf("total lines = %d, want %d (wc -l)", r.Code.Total, want)
	}
	wantCode := 5 + (MaxFuncLines+2)*2 // package, T (3 lines), short, and the two long ones
	if r.Code.Code() != wantCode {
		t.Errorf("code lines = %d, want %d", r.Code.Code(), wantCode)
	}
	if len(r.Funcs) != 3 || r.Funcs[0].Lines != MaxFuncLines+2 || r.Funcs[2].Name != "T.short" {
		t.Errorf("funcs = %+v", r.Funcs)
	}
	if long := r.Long(); len(long) != 1 || long[0].Name != "long" {
		t.Errorf("Long() = %+v, want only long (appendField is a table)", long)
	}
	if s := r.String(); !strings.Contains(s, "(table: ") || !strings.Contains(s, "long (p.go:") {
		t.Errorf("report:\n%s", s)
	}
}

func write(t *testing.T, dir, name, src string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}
