package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

const (
	rootPath    = "github.com/amqp091-drainer/amqp091-drainer"
	commandPath = rootPath + "/cmd/amqp091-drainer"
)

// e2eVersion is the version this test publishes both modules under, in a
// proxy of its own. It is new on every run: the module cache keeps what it
// downloaded of a version forever, so a reused version would run the
// command as an earlier run published it.
var e2eVersion = fmt.Sprintf("v0.0.1-e2e.%d", time.Now().UnixNano())

// TestInstallAtVersion runs the adoption command the way the README tells
// a user to, `go run .../cmd/amqp091-drainer@VERSION install`, inside a
// scratch module. The two modules of this checkout are published at
// e2eVersion into a file-based module proxy placed before the real one, as
// a release would publish them to the real one: the root module from the
// files of the checkout (tracked or not ignored, as git sees them), and the
// command's module with its requirement set to the root's new version, as
// docs/releasing.md does it.
func TestInstallAtVersion(t *testing.T) {
	sc := newScratch(t)
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	proxy := t.TempDir()
	t.Cleanup(func() { forgetE2EVersion(t) })
	rootSum := publish(t, proxy, repo, rootPath, nil)
	publish(t, proxy, filepath.Join(repo, "cmd", "amqp091-drainer"), commandPath, func(mod *modfile.File, sum []byte) ([]byte, []byte) {
		if err := mod.AddRequire(rootPath, e2eVersion); err != nil {
			t.Fatal(err)
		}
		out, err := mod.Format()
		if err != nil {
			t.Fatal(err)
		}
		// The command's go.sum is the root's plus the root itself: its
		// build list is the root's.
		rootGoSum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		return out, append(append(sum, rootGoSum...), rootSum...)
	})

	upstreamProxy, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{
		"GOPROXY=file://" + filepath.ToSlash(proxy) + "," + strings.TrimSpace(string(upstreamProxy)),
		"GONOSUMDB=" + rootPath, // unpublished: the checksum database has never seen it
		"GOFLAGS=",
	}
	out, err := sc.goCmdEnv(env, "run", commandPath+"@"+e2eVersion, "install")
	if err != nil {
		t.Fatalf("go run %s@%s install: %v", commandPath, e2eVersion, err)
	}
	if strings.Contains(out, "finding module for package") {
		t.Errorf("cmd/amqp091-drainer/go.mod misses a requirement: the go command chose a version itself")
	}
	if want := "added replace " + amqpPath + " => ./" + DefaultDir; !strings.Contains(out, want) {
		t.Errorf("install output does not say %q", want)
	}
	again, err := sc.goCmdEnv(env, "run", commandPath+"@"+e2eVersion, "install")
	if err != nil {
		t.Fatalf("second install: %v", err)
	}
	if !strings.Contains(again, "already in place; nothing written") {
		t.Errorf("second install did not report a no-op:\n%s", again)
	}
	sc.runProgram()
}

// publish writes the module in dir to the file proxy as path@e2eVersion
// and returns its go.sum lines. edit, if set, rewrites the published
// go.mod and go.sum.
func publish(t *testing.T, proxy, dir, path string, edit func(*modfile.File, []byte) ([]byte, []byte)) []byte {
	t.Helper()
	files := moduleFiles(t, dir)
	goMod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var goSum []byte
	if b, err := os.ReadFile(filepath.Join(dir, "go.sum")); err == nil {
		goSum = b
	}
	if edit != nil {
		mod, err := modfile.Parse("go.mod", goMod, nil)
		if err != nil {
			t.Fatal(err)
		}
		goMod, goSum = edit(mod, goSum)
	}
	overrides := map[string][]byte{"go.mod": goMod}
	if goSum != nil {
		overrides["go.sum"] = goSum
	}

	escaped, err := module.EscapePath(path)
	if err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	zipPath := filepath.Join(vdir, e2eVersion+".zip")
	var zf []modzip.File
	for _, rel := range files {
		zf = append(zf, zipFile{dir: dir, rel: rel, data: overrides[rel]})
	}
	var buf bytes.Buffer
	if err := modzip.Create(&buf, module.Version{Path: path, Version: e2eVersion}, zf); err != nil {
		t.Fatalf("zip %s: %v", path, err)
	}
	info, _ := json.Marshal(map[string]any{"Version": e2eVersion, "Time": time.Now().UTC()})
	for name, data := range map[string][]byte{
		"list": []byte(e2eVersion + "\n"), e2eVersion + ".info": info,
		e2eVersion + ".mod": goMod, e2eVersion + ".zip": buf.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	zipHash, err := dirhash.HashZip(zipPath, dirhash.Hash1)
	if err != nil {
		t.Fatal(err)
	}
	modHash, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(goMod)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return []byte(path + " " + e2eVersion + " " + zipHash + "\n" + path + " " + e2eVersion + "/go.mod " + modHash + "\n")
}

// moduleFiles lists the files of the module in dir as a commit of the
// checkout would have them: tracked, or untracked and not ignored, and not
// in a nested module.
func moduleFiles(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "--full-name", ".")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", dir, err)
	}
	prefix, err := exec.Command("git", "-C", dir, "rev-parse", "--show-prefix").Output()
	if err != nil {
		t.Fatal(err)
	}
	var files, nested []string
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		rel := strings.TrimPrefix(f, strings.TrimSpace(string(prefix)))
		if rel == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, rel)); err != nil {
			continue // deleted in the work tree
		}
		if strings.HasSuffix(rel, "/go.mod") {
			nested = append(nested, strings.TrimSuffix(rel, "go.mod"))
		}
		files = append(files, rel)
	}
	var keep []string
outer:
	for _, f := range files {
		for _, n := range nested {
			if strings.HasPrefix(f, n) {
				continue outer
			}
		}
		keep = append(keep, f)
	}
	return keep
}

// zipFile is a file of a module for modzip.Create, with optional contents
// that replace the file's own.
type zipFile struct {
	dir, rel string
	data     []byte
}

func (f zipFile) Path() string { return f.rel }

func (f zipFile) Lstat() (os.FileInfo, error) {
	fi, err := os.Lstat(filepath.Join(f.dir, f.rel))
	if err != nil || f.data == nil {
		return fi, err
	}
	return sizedInfo{fi, int64(len(f.data))}, nil
}

func (f zipFile) Open() (io.ReadCloser, error) {
	if f.data != nil {
		return io.NopCloser(bytes.NewReader(f.data)), nil
	}
	return os.Open(filepath.Join(f.dir, f.rel))
}

// sizedInfo reports the size of replaced contents.
type sizedInfo struct {
	os.FileInfo
	size int64
}

func (s sizedInfo) Size() int64 { return s.size }

// forgetE2EVersion removes e2eVersion of both modules from the module
// cache, which makes what it extracts read-only, so that test runs do not
// pile up copies of the repository there.
func forgetE2EVersion(t *testing.T) {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return
	}
	cache := strings.TrimSpace(string(out))
	for _, path := range []string{rootPath, commandPath} {
		escaped, err := module.EscapePath(path)
		if err != nil {
			continue
		}
		for _, dir := range []string{
			filepath.Join(cache, filepath.FromSlash(escaped)+"@"+e2eVersion),
			filepath.Join(cache, "cache", "download", filepath.FromSlash(escaped), "@v"),
		} {
			_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					_ = os.Chmod(p, 0o755)
				}
				return nil
			})
			if strings.HasSuffix(dir, "@v") {
				matches, _ := filepath.Glob(filepath.Join(dir, e2eVersion+".*"))
				for _, m := range matches {
					_ = os.Remove(m)
				}
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Logf("module cache: %v", err)
			}
		}
	}
}
