package overlaynames

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/mod/module"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeUpstream stands in for an upstream release: a little of everything
// that an overlay can reach, exported and not.
const fakeUpstream = `package fake

import "sync"

// Kinds of things.
const (
	kindA = iota
	kindB
	kindC
)

const maxSize = 4096

var defaultName = "x"

type base struct {
	id  int
	Tag string
}

type conn struct {
	base
	m      sync.Mutex
	frames chan frame
	_      [0]func()
}

type frame interface {
	channel() uint16
}

type box[T any] struct{ val T }

func (b *box[T]) get() T { return b.val }

func (c *conn) send(f frame) error { return nil }

// Exported is exported.
func (c *conn) Exported() {}

func helper() int { return maxSize }

func init() {}
`

// fakeOverlay uses one name of every kind, through every route: a
// receiver, a selector, a promoted field, an instantiated generic type, a
// composite literal key, an interface method. It also uses names that
// must not be reported: exported ones, its own, and ones that only the
// patched copy of the upstream file declares.
const fakeOverlay = `package fake

func (c *conn) drain() int {
	c.m.Lock()
	defer c.m.Unlock()
	var f frame
	_ = c.send(f)
	_ = f.channel()
	c.Exported()
	c.added++
	addedHook()
	_ = c.id
	_ = c.base.Tag
	_ = c.Tag
	b := box[int]{val: 1}
	_ = b.get()
	_ = kindB
	_ = defaultName
	return helper() + local()
}

func local() int { return 0 }
`

// patchAdds is what a patch of fakeUpstream adds: a field and a hook.
func patchAdds(upstream string) string {
	upstream = strings.Replace(upstream, "\tm      sync.Mutex\n", "\tm      sync.Mutex\n\tadded  int\n", 1)
	return upstream + "\nfunc addedHook() {}\n"
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestUsed(t *testing.T) {
	pristine, err := Declared(writeFiles(t, map[string]string{"up.go": fakeUpstream}))
	if err != nil {
		t.Fatal(err)
	}
	patched := writeFiles(t, map[string]string{
		"up.go":      patchAdds(fakeUpstream),
		"overlay.go": fakeOverlay,
		// A test file is not part of the package Used type-checks.
		"up_test.go": "package fake\n\nvar _ = undefinedInTests\n",
	})
	got, err := Used(patched, []string{"overlay.go"}, pristine)
	if err != nil {
		t.Fatal(err)
	}
	want := []Name{
		{KindField, "base.id"}, // promoted through conn.base
		{KindField, "box.val"},
		{KindField, "conn.base"},
		{KindField, "conn.m"},
		{KindMethod, "box.get"},
		{KindMethod, "conn.send"},
		{KindMethod, "frame.channel"},
		{KindType, "box"},
		{KindType, "conn"}, // the receiver of drain
		{KindType, "frame"},
		{KindConst, "kindB"},
		{KindFunc, "helper"},
		{KindVar, "defaultName"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Used =\n%v\nwant\n%v", got, want)
	}

	// Without the pristine filter, the patch's additions would count.
	all, err := Declared(patched)
	if err != nil {
		t.Fatal(err)
	}
	got, err = Used(patched, []string{"overlay.go"}, all)
	if err != nil {
		t.Fatal(err)
	}
	for _, added := range []Name{{KindField, "conn.added"}, {KindFunc, "addedHook"}} {
		if !slices.Contains(got, added) {
			t.Errorf("Used with the patched tree as pristine misses %v", added)
		}
	}
}

func TestUsedOverlayFiles(t *testing.T) {
	patched := writeFiles(t, map[string]string{
		"up.go":           patchAdds(fakeUpstream),
		"overlay.go":      fakeOverlay,
		"overlay_test.go": "package fake\n\nvar _ = helper\n",
	})
	if _, err := Used(patched, []string{"missing.go"}, nil); err == nil || !strings.Contains(err.Error(), "missing.go") {
		t.Errorf("Used with a missing overlay file: err = %v, want one naming the file", err)
	}
	// Test files are skipped, not refused, so that a caller can pass the
	// whole overlay folder: the type-checked package does not include them.
	pristine, err := Declared(writeFiles(t, map[string]string{"up.go": fakeUpstream}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Used(patched, []string{"overlay_test.go"}, pristine)
	if err != nil || len(got) != 0 {
		t.Errorf("Used with only a test file = %v, %v; want nothing", got, err)
	}
}

func TestUsedReportsTypeErrors(t *testing.T) {
	patched := writeFiles(t, map[string]string{"up.go": "package fake\n\nvar x = undefined\n"})
	if _, err := Used(patched, nil, nil); err == nil || !strings.Contains(err.Error(), "undefined") {
		t.Errorf("Used on a package that does not compile: err = %v", err)
	}
}

func TestDeclared(t *testing.T) {
	got, err := Declared(writeFiles(t, map[string]string{"up.go": fakeUpstream}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[Name]string{
		{KindConst, "kindA"}:          "kindA = iota // iota = 0",
		{KindConst, "kindB"}:          "kindB = iota // iota = 1",
		{KindConst, "kindC"}:          "kindC = iota // iota = 2",
		{KindConst, "maxSize"}:        "maxSize = 4096",
		{KindVar, "defaultName"}:      `defaultName = "x"`,
		{KindType, "base"}:            "base struct {\n\tid  int\n\tTag string\n}",
		{KindField, "base.id"}:        "int",
		{KindField, "base.Tag"}:       "string",
		{KindField, "conn.base"}:      "base",
		{KindField, "conn.m"}:         "sync.Mutex",
		{KindField, "conn.frames"}:    "chan frame",
		{KindType, "frame"}:           "frame interface {\n\tchannel() uint16\n}",
		{KindMethod, "frame.channel"}: "func() uint16",
		{KindType, "box"}:             "box[T any] struct {\n\tval T\n}",
		{KindField, "box.val"}:        "T",
		{KindMethod, "box.get"}:       "func (b *box[T]) get() T {\n\treturn b.val\n}",
		{KindMethod, "conn.send"}:     "func (c *conn) send(f frame) error {\n\treturn nil\n}",
		{KindMethod, "conn.Exported"}: "func (c *conn) Exported() {\n}",
		{KindFunc, "helper"}:          "func helper() int {\n\treturn maxSize\n}",
	}
	for name, text := range want {
		if got[name] != text {
			t.Errorf("Declared()[%v] = %q, want %q", name, got[name], text)
		}
	}
	// The rest is the type conn, whose text the other tests pin down by
	// comparison; blank fields and init are not names.
	for name := range got {
		if _, ok := want[name]; !ok && name != (Name{KindType, "conn"}) {
			t.Errorf("Declared() has the unexpected name %v", name)
		}
	}
}

func TestDeclaredIgnoresLayout(t *testing.T) {
	reformatted := strings.NewReplacer(
		"type base struct {", "// base is embedded.\ntype base struct {\n",
		"\tid  int\n", "\tid int // the id\n",
		"\tframes chan frame\n", "\tframes chan frame\n\n",
		"func helper() int { return maxSize }", "func helper() int {\n\n\treturn maxSize /* always */\n}",
		"func (c *conn) send(f frame) error { return nil }", "func (c *conn) send(\n\tf frame,\n) error {\n\treturn nil\n}",
	).Replace(fakeUpstream)
	if reformatted == fakeUpstream {
		t.Fatal("the replacements changed nothing")
	}
	a, err := Declared(writeFiles(t, map[string]string{"up.go": fakeUpstream}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Declared(writeFiles(t, map[string]string{"up.go": reformatted}))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(a, b) {
		t.Errorf("comments and layout changed Declared:\n%v", changed(a, b))
	}
}

func TestDeclaredSeesChanges(t *testing.T) {
	a, err := Declared(writeFiles(t, map[string]string{"up.go": fakeUpstream}))
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.NewReplacer(
		"return maxSize", "return maxSize + 1",
		"\tkindA = iota\n", "\tkindZ = iota\n\tkindA\n",
		"\tframes chan frame\n", "\tframes chan message\n",
	).Replace(fakeUpstream) + "\ntype message = frame\n"
	b, err := Declared(writeFiles(t, map[string]string{"up.go": edited}))
	if err != nil {
		t.Fatal(err)
	}
	want := []Name{
		{KindField, "conn.frames"},
		{KindType, "conn"},    // its field's type changed
		{KindType, "message"}, // added
		{KindConst, "kindA"},
		{KindConst, "kindB"}, // iota moved on by one
		{KindConst, "kindC"},
		{KindConst, "kindZ"}, // added
		{KindFunc, "helper"},
	}
	if got := changed(a, b); !slices.Equal(got, want) {
		t.Errorf("changed names = %v, want %v", got, want)
	}
}

// changed returns the names that a and b do not map to the same text.
func changed(a, b map[Name]string) []Name {
	var out []Name
	for name := range maps.Keys(a) {
		if text, ok := b[name]; !ok || text != a[name] {
			out = append(out, name)
		}
	}
	for name := range maps.Keys(b) {
		if _, ok := a[name]; !ok {
			out = append(out, name)
		}
	}
	slices.SortFunc(out, compareNames)
	return out
}

func TestMarkdown(t *testing.T) {
	got := Markdown([]Name{
		{KindField, "Connection.m"},
		{KindField, "consumers.chans"},
		{KindMethod, "Channel.send"},
		{KindFunc, "newError"},
	})
	want := "4 names: 2 struct fields, 1 method, 1 function\n" +
		"\n" +
		"- struct fields: `Connection.m`, `consumers.chans`\n" +
		"- methods: `Channel.send`\n" +
		"- functions: `newError`\n"
	if got != want {
		t.Errorf("Markdown =\n%s\nwant\n%s", got, want)
	}
	if got, want := Markdown(nil), "0 names\n"; got != want {
		t.Errorf("Markdown(nil) = %q, want %q", got, want)
	}
}

func TestParseReadsMarkdown(t *testing.T) {
	names := []Name{
		{KindVar, "defaultName"},
		{KindField, "Connection.m"},
		{KindMethod, "Channel.send"},
		{KindType, "frame"},
		{KindConst, "frameEnd"},
		{KindFunc, "newError"},
		{KindField, "Channel.rpc"},
	}
	want := slices.Clone(names)
	Sort(want)
	if want[0] != (Name{KindField, "Channel.rpc"}) || want[len(want)-1] != (Name{KindVar, "defaultName"}) {
		t.Fatalf("Sort = %v, want fields first and variables last", want)
	}
	doc, err := Replace([]byte("# Patches\n"+BeginMarker+"\n"+EndMarker+"\n"), Markdown(names))
	if err != nil {
		t.Fatal(err)
	}
	if got := Parse(doc); !slices.Equal(got, want) {
		t.Errorf("Parse(Markdown) = %v, want %v", got, want)
	}
	if got := Parse([]byte("# Patches\n")); got != nil {
		t.Errorf("Parse without markers = %v, want nothing", got)
	}
}

func TestReplace(t *testing.T) {
	doc := "# Patches\n\n" + BeginMarker + "\nold\nlines\n" + EndMarker + "\n\nafter\n"
	got, err := Replace([]byte(doc), "new\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Patches\n\n" + BeginMarker + "\nnew\n" + EndMarker + "\n\nafter\n"
	if string(got) != want {
		t.Errorf("Replace =\n%s\nwant\n%s", got, want)
	}
	again, err := Replace(got, "new")
	if err != nil || string(again) != want {
		t.Errorf("Replace of its own output = %q, %v; want it unchanged", again, err)
	}

	for name, doc := range map[string]string{
		"no markers":   "# Patches\n",
		"no begin":     "x\n" + EndMarker + "\n",
		"no end":       BeginMarker + "\nx\n",
		"out of order": EndMarker + "\nx\n" + BeginMarker + "\n",
		"two begins":   BeginMarker + "\n" + BeginMarker + "\nx\n" + EndMarker + "\n",
	} {
		if out, err := Replace([]byte(doc), "new\n"); err == nil {
			t.Errorf("%s: Replace = %q, want an error", name, out)
		}
	}
}

// TestUsedOnTheRealTree runs Used as scripts/overlay-names does: on the
// vendored tree, with the overlay files of upstream/_overlay and the
// pinned release as pristine.
func TestUsedOnTheRealTree(t *testing.T) {
	patched := filepath.Join("..", "..", "upstream", "amqp091-go")
	if _, err := os.Stat(patched); err != nil {
		t.Skipf("no vendored tree (run make vendor): %v", err)
	}
	paths, err := filepath.Glob(filepath.Join("..", "..", "upstream", "_overlay", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var overlay []string
	for _, p := range paths {
		if !strings.HasSuffix(p, "_test.go") {
			overlay = append(overlay, filepath.Base(p))
		}
	}
	if len(overlay) == 0 {
		t.Fatal("no overlay files in upstream/_overlay")
	}
	pristine, err := Declared(pristineDir(t))
	if err != nil {
		t.Fatal(err)
	}

	names, err := Used(patched, overlay, pristine)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("Used found no upstream names in the overlay")
	}
	t.Log(strings.SplitN(Markdown(names), "\n", 2)[0])
	if !slices.IsSortedFunc(names, compareNames) {
		t.Error("Used's names are not sorted")
	}
	for _, n := range names {
		own := n.Name[strings.LastIndex(n.Name, ".")+1:]
		if _, ok := pristine[n]; !ok || own == "" || strings.ToLower(own[:1]) != own[:1] {
			t.Errorf("Used reported %v, which is not an unexported name of the pristine release", n)
		}
	}
	// The patches add these to upstream's files; the overlay uses them.
	for _, ours := range []Name{
		{KindField, "Connection.rp"},
		{KindField, "DeferredConfirmation.pump"},
	} {
		if slices.Contains(names, ours) {
			t.Errorf("Used reported %v, which a patch adds", ours)
		}
	}
}

// TestRefresh checks that Refresh writes the list it returns, in a form
// Parse reads back.
func TestRefresh(t *testing.T) {
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "upstream", "amqp091-go")); err != nil {
		t.Skipf("no vendored tree (run make vendor): %v", err)
	}
	doc := []byte("# Patches\n\n" + BeginMarker + "\nstale\n" + EndMarker + "\n")
	updated, used, err := Refresh(t.Context(), root, doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(used) == 0 {
		t.Fatal("Refresh found no upstream names in the overlay")
	}
	if got := Parse(updated); !slices.Equal(got, used) {
		t.Errorf("Parse(Refresh's document) = %v, want Refresh's list %v", got, used)
	}
	if want, _ := Replace(doc, Markdown(used)); string(updated) != string(want) {
		t.Errorf("Refresh wrote\n%s\nwant\n%s", updated, want)
	}
}

// pristineDir returns the module cache's copy of the release upstream/PIN
// names, downloading it first if the cache lacks it.
func pristineDir(t *testing.T) string {
	t.Helper()
	pin, err := os.ReadFile(filepath.Join("..", "..", "upstream", "PIN"))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(pin))
	if len(fields) < 2 {
		t.Fatalf("upstream/PIN: want a go.sum line, got %q", pin)
	}
	path, version := fields[0], fields[1]
	escPath, err := module.EscapePath(path)
	if err != nil {
		t.Fatal(err)
	}
	escVersion, err := module.EscapeVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(cache)), escPath+"@"+escVersion)
	if _, err := os.Stat(dir); err == nil {
		return dir
	}

	// Outside any module, so that neither go.mod's replace directive nor a
	// go.work decides what is fetched.
	cmd := exec.Command("go", "mod", "download", path+"@"+version)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod download %s@%s: %v\n%s", path, version, err, out)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}
