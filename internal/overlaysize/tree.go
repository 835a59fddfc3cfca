package overlaysize

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// TreeDirs are the module's folders that MaxFuncLines holds for, as the
// overlay's rule (issue #39): the failover packages, compat, and the
// internal tooling.
var TreeDirs = []string{"failover", "compat", "internal"}

// TreeTables are the functions of TreeDirs allowed past MaxFuncLines, by
// package folder and name ("internal/x.Type.Method"), with the reason: a
// table, where a split would hide it rather than shorten the logic.
// Empty: nothing there is one today.
var TreeTables = map[string]string{}

// Tree returns the functions over MaxFuncLines in the non-test Go files
// under each of dirs (folders relative to root; testdata skipped) that are
// not in TreeTables, longest first. Func.File is the path from root.
func Tree(root string, dirs ...string) ([]Func, error) {
	var out []Func
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, fn := range funcs(fset, f, rel) {
				_, table := TreeTables[path.Dir(rel)+"."+fn.Name]
				if fn.Lines > MaxFuncLines && !table {
					out = append(out, fn)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Lines > out[j].Lines })
	return out, nil
}
