// Package overlaynames lists the unexported amqp091-go names that our
// overlay files depend on.
//
// The overlay files (upstream/_overlay/*.go) are compiled into package
// amqp091, so they can reach upstream's unexported fields, methods, types,
// constants, functions and variables. None of those are covered by
// upstream's compatibility promise: any release may rename, remove or
// change them, and a rebase then breaks the overlay without a failing hunk
// to point at it. This package answers the two questions a rebase needs:
// which of those names the overlay uses (Used) and which of them a new
// release changed (compare two Declared maps). Markdown and Replace keep
// the list in PATCHES.md up to date.
//
// Everything here works from the source alone (go/parser, go/types and the
// source importer), because amqp091-go's non-test code imports only the
// standard library.
package overlaynames

import (
	"bytes"
	"cmp"
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/printer"
	"go/token"
	"go/types"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// The kinds of Name, in the order Used sorts them and Markdown lists them.
const (
	KindField  = "struct field"
	KindMethod = "method"
	KindType   = "type"
	KindConst  = "constant"
	KindFunc   = "function"
	KindVar    = "variable"
)

// kinds is the sort order of the kinds: the dependencies a rebase most
// often trips over (fields and methods of upstream's types) come first.
var kinds = []string{KindField, KindMethod, KindType, KindConst, KindFunc, KindVar}

// Name is one declared name of a package.
type Name struct {
	// Kind is one of the Kind constants.
	Kind string
	// Name is qualified by its type for a struct field or method, as in
	// "Connection.m" or "Channel.recvMethod" (no pointer star, no type
	// parameters), and bare for a package-level name, as in "frameMinSize".
	Name string
}

// String returns the kind and the name, as in "method Channel.call".
func (n Name) String() string { return n.Kind + " " + n.Name }

// Declared returns every name declared by the non-test Go files of the
// package in dir: the package-level types, constants, functions and
// variables, the methods of its named types (interface methods included)
// and the fields of its named struct types. Blank names and init functions
// are left out, since nothing can refer to them.
//
// Each name maps to a normalised text of its declaration, so that two
// releases can be compared name by name: for a struct field, its type;
// for a function or method, the whole declaration; for an interface
// method, its signature; for a type, its type spec; for a constant or a
// variable, its value spec. Comments are dropped and the text is printed
// from a syntax tree stripped of positions, so edits to comments, blank
// lines, line breaks and trailing commas do not change it. A constant
// that repeats the previous expression of its group (iota constants) is
// printed with that expression, and with its index when the expression
// uses iota, since both determine its value.
func Declared(dir string) (map[Name]string, error) {
	fset := token.NewFileSet()
	files, err := parseDir(fset, dir)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		clearPositions(f)
	}
	out := make(map[Name]string)
	var printErr error
	eachDecl(files, func(d decl) {
		text, err := d.text()
		if err != nil && printErr == nil {
			printErr = fmt.Errorf("printing %s in %s: %w", d.name, dir, err)
		}
		out[d.name] = text
	})
	if printErr != nil {
		return nil, printErr
	}
	return out, nil
}

// Used type-checks the package in patchedDir and returns the unexported
// names that the overlay files use, sorted by kind (in the order of the
// Kind constants) and then by name.
//
// A name counts when its own identifier is unexported, it is declared in
// one of the package's other files, and it is a key of pristine (Declared
// of the unpatched release): names that our patches add to upstream's
// files, such as Connection.rp, are ours, not upstream's, and do not
// count. A field or method reached through an embedded field counts where
// it is declared.
//
// overlayFiles are base names of files of that package. Test files
// (*_test.go) are skipped: they are not part of the package that is
// type-checked, so their uses cannot be resolved, and callers may pass the
// whole overlay folder. Naming any other file that is not in the package
// is an error, because a misspelt name would otherwise silently contribute
// nothing.
func Used(patchedDir string, overlayFiles []string, pristine map[Name]string) ([]Name, error) {
	fset := token.NewFileSet()
	files, err := parseDir(fset, patchedDir)
	if err != nil {
		return nil, err
	}
	overlay, walk, err := overlayOf(fset, files, overlayFiles, patchedDir)
	if err != nil {
		return nil, err
	}
	// Uses alone suffices: go/types records the object of every identifier
	// that refers to one, a selector's Sel included (so fields and methods,
	// promoted ones at their declaration), and Defs maps each declaring
	// identifier back to the object that eachDecl names.
	info := &types.Info{
		Defs: make(map[*ast.Ident]types.Object),
		Uses: make(map[*ast.Ident]types.Object),
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	if _, err := conf.Check(files[0].Name.Name, fset, files, info); err != nil {
		return nil, fmt.Errorf("type-checking %s: %w", patchedDir, err)
	}
	names := make(map[types.Object]Name)
	eachDecl(files, func(d decl) {
		if obj := info.Defs[d.ident]; obj != nil {
			names[obj] = d.name
		}
	})
	seen := make(map[Name]bool)
	for _, f := range walk {
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok {
				if name, ok := upstreamName(fset, info, names, overlay, id); ok {
					if _, ok := pristine[name]; ok {
						seen[name] = true
					}
				}
			}
			return true
		})
	}
	out := make([]Name, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	Sort(out)
	return out, nil
}

// overlayOf picks out of the package's files the overlay's, named by
// overlayFiles, skipping test files; overlay holds their base names, and
// walk has each once.
func overlayOf(fset *token.FileSet, files []*ast.File, overlayFiles []string,
	patchedDir string) (overlay map[string]bool, walk []*ast.File, err error) {
	byName := make(map[string]*ast.File, len(files))
	for _, f := range files {
		byName[fileName(fset, f.Pos())] = f
	}
	overlay = make(map[string]bool, len(overlayFiles))
	for _, name := range overlayFiles {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, ok := byName[name]
		if !ok {
			return nil, nil, fmt.Errorf("overlay file %q is not a non-test Go file of the package in %s",
				name, patchedDir)
		}
		if !overlay[name] {
			overlay[name] = true
			walk = append(walk, f)
		}
	}
	return overlay, walk, nil
}

// upstreamName returns the name of what id refers to when that is an
// unexported name declared in the package outside the overlay files.
func upstreamName(fset *token.FileSet, info *types.Info, names map[types.Object]Name,
	overlay map[string]bool, id *ast.Ident) (Name, bool) {
	obj := origin(info.Uses[id])
	if obj == nil || obj.Exported() || overlay[fileName(fset, obj.Pos())] {
		return Name{}, false
	}
	name, ok := names[obj] // not there: a local, a parameter, a label, or another package's name
	return name, ok
}

// Sort sorts names as Used returns them: by kind, in the order of the Kind
// constants, and then by name.
func Sort(names []Name) { slices.SortFunc(names, compareNames) }

// origin returns the generic object behind an instantiated field or
// method, which is the one its declaration defines.
func origin(obj types.Object) types.Object {
	switch obj := obj.(type) {
	case *types.Var:
		return obj.Origin()
	case *types.Func:
		return obj.Origin()
	}
	return obj
}

func compareNames(a, b Name) int {
	return cmp.Or(cmp.Compare(kindRank(a.Kind), kindRank(b.Kind)),
		cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name))
}

// kindRank places unknown kinds after the known ones.
func kindRank(kind string) int {
	if i := slices.Index(kinds, kind); i >= 0 {
		return i
	}
	return len(kinds)
}

func fileName(fset *token.FileSet, pos token.Pos) string {
	return filepath.Base(fset.Position(pos).Filename)
}

// parseDir parses the files that `go build` would compile for the package
// in dir, without comments: no caller needs them, and without them the
// printer cannot print them.
func parseDir(fset *token.FileSet, dir string) ([]*ast.File, error) {
	pkg, err := build.ImportDir(dir, 0)
	if err != nil {
		return nil, fmt.Errorf("listing the package in %s: %w", dir, err)
	}
	if len(pkg.CgoFiles) > 0 {
		return nil, fmt.Errorf("the package in %s uses cgo, which this reader does not handle", dir)
	}
	files := make([]*ast.File, 0, len(pkg.GoFiles))
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// decl is one declared name: the identifier that declares it and a way to
// print its normalised declaration.
type decl struct {
	name  Name
	ident *ast.Ident
	text  func() (string, error)
}

// eachDecl calls fn for every name Declared reports, in source order.
func eachDecl(files []*ast.File, fn func(decl)) {
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				funcDecl(d, fn)
			case *ast.GenDecl:
				genDecl(d, fn)
			}
		}
	}
}

func funcDecl(d *ast.FuncDecl, fn func(decl)) {
	if d.Name.Name == "_" {
		return
	}
	text := func() (string, error) { return render(d) }
	if d.Recv == nil {
		if d.Name.Name != "init" {
			fn(decl{Name{KindFunc, d.Name.Name}, d.Name, text})
		}
		return
	}
	if len(d.Recv.List) == 1 {
		if recv := baseTypeName(d.Recv.List[0].Type); recv != "" {
			fn(decl{Name{KindMethod, recv + "." + d.Name.Name}, d.Name, text})
		}
	}
}

func genDecl(d *ast.GenDecl, fn func(decl)) {
	switch d.Tok {
	case token.TYPE:
		for _, s := range d.Specs {
			typeSpec(s.(*ast.TypeSpec), fn)
		}
	case token.VAR:
		for _, s := range d.Specs {
			s := s.(*ast.ValueSpec)
			valueSpec(KindVar, s, func() (string, error) { return render(s) }, fn)
		}
	case token.CONST:
		// A constant spec without values repeats the type and values of the
		// last one with values, and iota is the spec's index in the group:
		// the text carries both, or a bare "frameBody" would say nothing.
		var last *ast.ValueSpec
		for i, s := range d.Specs {
			s := s.(*ast.ValueSpec)
			if len(s.Values) > 0 {
				last = s
			}
			full := s
			if last != nil && last != s {
				full = &ast.ValueSpec{Names: s.Names, Type: last.Type, Values: last.Values}
			}
			valueSpec(KindConst, s, func() (string, error) {
				text, err := render(full)
				if err == nil && usesIota(full.Values) {
					text += fmt.Sprintf(" // iota = %d", i)
				}
				return text, err
			}, fn)
		}
	}
}

func typeSpec(s *ast.TypeSpec, fn func(decl)) {
	if s.Name.Name == "_" {
		return
	}
	fn(decl{Name{KindType, s.Name.Name}, s.Name, func() (string, error) { return render(s) }})
	if s.Assign.IsValid() {
		return // an alias declares no fields or methods of its own
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		for _, field := range t.Fields.List {
			text := func() (string, error) { return render(field.Type) }
			if len(field.Names) == 0 {
				// An embedded field is named by its type, and go/types
				// records the field's definition at that identifier.
				if id := embeddedIdent(field.Type); id != nil {
					fn(decl{Name{KindField, s.Name.Name + "." + id.Name}, id, text})
				}
				continue
			}
			for _, id := range field.Names {
				if id.Name != "_" {
					fn(decl{Name{KindField, s.Name.Name + "." + id.Name}, id, text})
				}
			}
		}
	case *ast.InterfaceType:
		for _, m := range t.Methods.List {
			sig, ok := m.Type.(*ast.FuncType)
			if !ok {
				continue // an embedded interface or a type set, not a method
			}
			for _, id := range m.Names {
				if id.Name != "_" {
					fn(decl{Name{KindMethod, s.Name.Name + "." + id.Name}, id, func() (string, error) { return render(sig) }})
				}
			}
		}
	}
}

func valueSpec(kind string, s *ast.ValueSpec, text func() (string, error), fn func(decl)) {
	for _, id := range s.Names {
		if id.Name != "_" {
			fn(decl{Name{kind, id.Name}, id, text})
		}
	}
}

// baseTypeName returns T for a receiver of type T, *T, T[P] or *T[P].
func baseTypeName(x ast.Expr) string {
	if id := embeddedIdent(x); id != nil {
		return id.Name
	}
	return ""
}

// embeddedIdent returns the identifier that names an embedded field or a
// receiver's type: T in T, *T, (T), pkg.T and their instantiations.
func embeddedIdent(x ast.Expr) *ast.Ident {
	for {
		switch t := x.(type) {
		case *ast.ParenExpr:
			x = t.X
		case *ast.StarExpr:
			x = t.X
		case *ast.IndexExpr:
			x = t.X
		case *ast.IndexListExpr:
			x = t.X
		case *ast.SelectorExpr:
			return t.Sel
		case *ast.Ident:
			return t
		default:
			return nil
		}
	}
}

func usesIota(exprs []ast.Expr) bool {
	found := false
	for _, x := range exprs {
		ast.Inspect(x, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && id.Name == "iota" {
				found = true
			}
			return !found
		})
	}
	return found
}

// render prints a node whose positions clearPositions removed.
func render(node any) (string, error) {
	var buf bytes.Buffer
	cfg := printer.Config{Mode: printer.UseSpaces | printer.TabIndent, Tabwidth: 8}
	if err := cfg.Fprint(&buf, token.NewFileSet(), node); err != nil {
		return "", err
	}
	return buf.String(), nil
}

var posType = reflect.TypeFor[token.Pos]()

// clearPositions sets every position in the tree to token.NoPos. The
// printer keeps the line breaks and blank lines it finds between
// positions; without positions it lays every node out the one way it
// lays out a tree built by a program, so the text depends on the syntax
// alone.
func clearPositions(root ast.Node) {
	ast.Inspect(root, func(n ast.Node) bool {
		v := reflect.ValueOf(n)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return true
		}
		v = v.Elem()
		for i := range v.NumField() {
			if f := v.Field(i); f.Type() == posType && f.CanSet() {
				f.SetInt(int64(token.NoPos))
			}
		}
		return true
	})
}

// Markdown renders names (sorted as Used returns them) as the block that
// PATCHES.md keeps between BeginMarker and EndMarker: a line counting the
// names of each kind, then one bullet per kind listing its names.
func Markdown(names []Name) string {
	byKind := make(map[string][]string)
	var order []string
	for _, n := range names {
		if _, ok := byKind[n.Kind]; !ok {
			order = append(order, n.Kind)
		}
		byKind[n.Kind] = append(byKind[n.Kind], "`"+n.Name+"`")
	}
	slices.SortStableFunc(order, func(a, b string) int {
		return cmp.Or(cmp.Compare(kindRank(a), kindRank(b)), cmp.Compare(a, b))
	})

	var b strings.Builder
	counts := make([]string, len(order))
	for i, kind := range order {
		counts[i] = plural(len(byKind[kind]), kind)
	}
	b.WriteString(plural(len(names), "name"))
	if len(counts) > 0 {
		b.WriteString(": " + strings.Join(counts, ", "))
	}
	b.WriteString("\n")
	if len(order) > 0 {
		b.WriteString("\n")
	}
	for _, kind := range order {
		fmt.Fprintf(&b, "- %s: %s\n", kind+"s", strings.Join(byKind[kind], ", "))
	}
	return b.String()
}

// Parse returns the names listed in the block between BeginMarker and
// EndMarker of doc, as Markdown wrote them, sorted as Used returns them:
// the list a document was last generated with, for telling which names a
// new list adds or drops. A document without the block lists nothing.
func Parse(doc []byte) []Name {
	begin, err := markerIndex(doc, BeginMarker)
	if err != nil {
		return nil
	}
	end, err := markerIndex(doc, EndMarker)
	if err != nil || end < begin {
		return nil
	}
	var out []Name
	for _, line := range strings.Split(string(doc[begin+len(BeginMarker):end]), "\n") {
		label, list, ok := strings.Cut(strings.TrimPrefix(line, "- "), ": ")
		if !ok || !strings.HasPrefix(line, "- ") || !strings.HasSuffix(label, "s") {
			continue // the summary line, or not Markdown's
		}
		kind := strings.TrimSuffix(label, "s")
		for _, item := range strings.Split(list, ", ") {
			if name := strings.Trim(strings.TrimSpace(item), "`"); name != "" {
				out = append(out, Name{kind, name})
			}
		}
	}
	Sort(out)
	return out
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// The markers that delimit the generated block in PATCHES.md. The begin
// marker says how the block is made, so that nobody edits it by hand.
const (
	BeginMarker = "<!-- overlay-names:begin (generated by scripts/overlay-names; do not edit) -->"
	EndMarker   = "<!-- overlay-names:end -->"
)

// Replace returns a copy of doc in which the text between BeginMarker and
// EndMarker is block, which starts on the line after the begin marker and
// ends on the line before the end marker. Each marker must occur exactly
// once, the begin marker first: anything else means the document was
// edited in a way a generator should not guess about.
func Replace(doc []byte, block string) ([]byte, error) {
	begin, err := markerIndex(doc, BeginMarker)
	if err != nil {
		return nil, err
	}
	end, err := markerIndex(doc, EndMarker)
	if err != nil {
		return nil, err
	}
	if end < begin {
		return nil, fmt.Errorf("the marker %s comes before %s", EndMarker, BeginMarker)
	}
	if block != "" && !strings.HasSuffix(block, "\n") {
		block += "\n"
	}
	begin += len(BeginMarker)
	out := make([]byte, 0, len(doc)-(end-begin)+1+len(block))
	out = append(out, doc[:begin]...)
	out = append(out, '\n')
	out = append(out, block...)
	out = append(out, doc[end:]...)
	return out, nil
}

func markerIndex(doc []byte, marker string) (int, error) {
	switch bytes.Count(doc, []byte(marker)) {
	case 0:
		return 0, fmt.Errorf("the marker %s is missing", marker)
	case 1:
		return bytes.Index(doc, []byte(marker)), nil
	default:
		return 0, fmt.Errorf("the marker %s occurs more than once", marker)
	}
}
