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
		t.Errorf("comment lines = %d, want 4 (the package doc, the block comment's two lines, T's doc)",
			r.Code.Comment)
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
	if long := r.LongFuncs(); len(long) != 1 || long[0].Name != "long" {
		t.Errorf("LongFuncs() = %+v, want only long (appendField is a table)", long)
	}
	if s := r.String(); !strings.Contains(s, "(table: ") || !strings.Contains(s, "long (p.go:") {
		t.Errorf("report:\n%s", s)
	}
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), "1 overlay functions are over") {
		t.Errorf("Check() = %v, want the long function", err)
	}
}

// TestCommentsInsideCode: a comment line inside a call or a composite
// literal is a comment line; a line a comment shares with code is code.
func TestCommentsInsideCode(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "p.go", `package p

var x = []int{
	// one
	1, /* two */
	/* three */ 3,
}

func f() {
	g(
		// the argument
		1,
	)
}

func g(int) {}
`)
	r, err := Measure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Code.Comment != 2 || r.Code.Code() != 11 {
		t.Errorf("comment %d, code %d; want 2 (// one, // the argument) and 11",
			r.Code.Comment, r.Code.Code())
	}
}

// TestLongLines: width is in runes, a tab counting as one, and only the
// non-test files' lines count.
func TestLongLines(t *testing.T) {
	dir := t.TempDir()
	at := func(n int) string { return "// " + strings.Repeat("x", n-3) } // a comment n runes wide
	lines := []string{
		"package p",
		at(MaxWidth),                            // 2: exactly the bound: not long
		at(MaxWidth + 1),                        // 3: long
		"// " + strings.Repeat("é", MaxWidth-3), // 4: 100 runes, 197 bytes: not long
		"\t\t" + at(MaxWidth-2),                 // 5: two tabs are two characters: not long
		"\t\t" + at(MaxWidth-1),                 // 6: long
		"var s = `" + strings.Repeat("y", MaxWidth) + "`", // 7: long, and code
	}
	write(t, dir, "p.go", strings.Join(lines, "\n")+"\n")
	write(t, dir, "p_test.go", "package p\n"+at(MaxWidth+50)+"\n")
	r, err := Measure(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []Line{{"p.go", 3, MaxWidth + 1}, {"p.go", 6, MaxWidth + 1}, {"p.go", 7, MaxWidth + 10}}
	n := len(want)
	if len(r.LongLines) != n || r.Code.Long != n || r.ByFile["p.go"].Long != n {
		t.Fatalf("long lines %+v (count %d), want %+v", r.LongLines, r.Code.Long, want)
	}
	for i, l := range want {
		if r.LongLines[i] != l {
			t.Errorf("long line %d = %+v, want %+v", i, r.LongLines[i], l)
		}
	}
	if r.Tests.Long != 1 {
		t.Errorf("tests' long lines = %d, want 1 (counted apart)", r.Tests.Long)
	}
	if err := r.Check(); err != nil {
		t.Errorf("Check() = %v with %d long lines, want nil (%d allowed)", err, len(want), MaxLongLines)
	}
	// Over the allowance, Check lists every long line as file:line.
	write(t, dir, "q.go", "package p\n"+strings.Repeat(at(MaxWidth+1)+"\n", MaxLongLines))
	if r, err = Measure(dir); err != nil {
		t.Fatal(err)
	}
	err = r.Check()
	if err == nil {
		t.Fatalf("Check() = nil with %d long lines", len(r.LongLines))
	}
	for _, s := range []string{"23 overlay lines are over 100 characters, 20 allowed", "p.go:3 (101)",
		"q.go:2 (101)", "q.go:21 (101)"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Check() = %v, want it to say %q", err, s)
		}
	}
}

func TestSummaryAndBudget(t *testing.T) {
	l := Lines{Files: 34, NonBlank: 6354, Comment: 896, Long: 194}
	r := Report{Code: l}
	want := "overlay: 34 files, 5458 code lines of 5800 budgeted, 896 comment lines " +
		"(14% of non-blank), 194 lines over 100 characters (20 allowed)"
	if got := r.Summary(); got != want {
		t.Errorf("Summary() =\n%s\nwant\n%s", got, want)
	}
	for _, c := range []struct{ comment, nonBlank, share int }{
		{0, 0, 0}, {1, 3, 33}, {1, 2, 50}, {1, 8, 13}, {1, 200, 1}, {1, 201, 0}, {5, 5, 100},
	} {
		if got := (Lines{Comment: c.comment, NonBlank: c.nonBlank}).CommentShare(); got != c.share {
			t.Errorf("CommentShare() of %d/%d = %d, want %d", c.comment, c.nonBlank, got, c.share)
		}
	}
	// The budget counts code only: comments do not count against it.
	r.Code = Lines{NonBlank: MaxCodeLines + 1000, Comment: 1000}
	if err := r.Check(); err != nil {
		t.Errorf("Check() = %v at exactly %d code lines", err, MaxCodeLines)
	}
	r.Code.NonBlank++
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), "5801 code lines") {
		t.Errorf("Check() = %v at %d code lines", err, MaxCodeLines+1)
	}
}

func TestTree(t *testing.T) {
	root := t.TempDir()
	body := func(name string, n int) string {
		return "func " + name + "() {\n" + strings.Repeat("\t_ = 1\n", n-2) + "}\n"
	}
	write(t, filepath.Join(root, "a"), "a.go",
		"package a\n\n"+body("ok", MaxFuncLines)+body("over", MaxFuncLines+1))
	write(t, filepath.Join(root, "a", "b"), "b.go", "package b\n\ntype T struct{}\n\nfunc (T) "+
		strings.TrimPrefix(body("M", MaxFuncLines+5), "func ")+body("table", MaxFuncLines+9))
	write(t, filepath.Join(root, "a"), "a_test.go", "package a\n\n"+body("inTest", MaxFuncLines+20))
	write(t, filepath.Join(root, "a", "testdata"), "x.go", "package x\n\n"+body("inTestdata", 99))
	write(t, filepath.Join(root, "c"), "c.go", "package c\n\n"+body("elsewhere", 99))
	TreeTables["a/b.table"] = "a test table"
	defer delete(TreeTables, "a/b.table")

	got, err := Tree(root, "a")
	if err != nil {
		t.Fatal(err)
	}
	want := []Func{
		{"T.M", "a/b/b.go", 5, MaxFuncLines + 5},
		{"over", "a/a.go", 3 + MaxFuncLines, MaxFuncLines + 1},
	}
	if len(got) != len(want) {
		t.Fatalf("Tree = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Tree[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func write(t *testing.T, dir, name, src string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}
