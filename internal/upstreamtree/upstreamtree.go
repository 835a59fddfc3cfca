// Package upstreamtree builds the patched amqp091-go tree reproducibly.
//
// Build, in order:
//  1. fetches exactly the pinned module version through the Go module proxy
//     (`go mod download`, so GOPROXY, GONOSUMDB and friends apply as usual);
//  2. refuses to go on unless the zip's h1: hash equals the pinned one;
//  3. extracts the module (golang.org/x/mod/zip) into a scratch folder;
//  4. applies each patch with github.com/bluekeyes/go-gitdiff, stopping at
//     the first hunk that does not apply and naming the patch, file and hunk;
//  5. adds the overlay files;
//  6. writes a stamp of every input and of the resulting files, and only then
//     moves the tree into place.
//
// A second Build with the same inputs finds the stamp matching and does
// nothing; any change to the pin, a patch, an overlay file or the tree
// itself makes it build again from scratch.
package upstreamtree

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// StampFile is the name, inside a built tree, of the stamp Build writes.
const StampFile = ".amqp091-drainer-stamp"

// stampFormat changes whenever Build's output for the same inputs changes,
// so that trees built by an older Build are rebuilt.
const stampFormat = "amqp091-drainer upstreamtree v1"

// Pin is the one module version that Build accepts, with its go.sum hash.
type Pin struct {
	Path    string // module path, e.g. github.com/rabbitmq/amqp091-go
	Version string // e.g. v1.16.0
	Hash    string // go.sum hash of the module zip, "h1:..."
}

// String formats the pin as a go.sum line.
func (p Pin) String() string { return p.Path + " " + p.Version + " " + p.Hash }

// ReadPin reads the pin of the checkout at root: its upstream/PIN.
func ReadPin(root string) (Pin, error) {
	data, err := os.ReadFile(filepath.Join(root, "upstream", "PIN"))
	if err != nil {
		return Pin{}, err
	}
	return ParsePin(data)
}

// ParsePin reads a pin in go.sum line format: "path version h1:hash".
// Blank lines and lines starting with # are ignored; exactly one pin must
// remain.
func ParsePin(data []byte) (Pin, error) {
	var pins []Pin
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[2], "h1:") {
			return Pin{}, fmt.Errorf("pin line %d: want \"module version h1:hash\", got %q", n, line)
		}
		if err := module.Check(f[0], f[1]); err != nil {
			return Pin{}, fmt.Errorf("pin line %d: %w", n, err)
		}
		pins = append(pins, Pin{Path: f[0], Version: f[1], Hash: f[2]})
	}
	if len(pins) != 1 {
		return Pin{}, fmt.Errorf("pin: want exactly one module line, found %d", len(pins))
	}
	return pins[0], nil
}

// File is one named input: a patch or an overlay file.
type File struct {
	Name string
	Data []byte
}

// Sources are all the inputs of a patched tree.
type Sources struct {
	Pin     Pin
	Patches []File // applied in this order
	Overlay []File // copied into the tree's root
}

// inputStamp hashes every input and the stamp format.
func (s Sources) inputStamp() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", stampFormat, s.Pin)
	for _, group := range []struct {
		kind  string
		files []File
	}{{"patch", s.Patches}, {"overlay", s.Overlay}} {
		for _, f := range group.files {
			fmt.Fprintf(h, "%s %s %d\n", group.kind, f.Name, len(f.Data))
			h.Write(f.Data)
		}
	}
	return "inputs " + hex.EncodeToString(h.Sum(nil))
}

// Result says what Build did.
type Result struct {
	Dir     string // the tree
	Rebuilt bool   // false when the stamp matched and nothing was done
	Zip     string // the verified module zip, when one was fetched
}

// Build makes dir the patched tree for src. It is a no-op when dir already
// holds a tree whose stamp matches src and whose files are untouched.
func Build(ctx context.Context, src Sources, dir string) (Result, error) {
	want := src.inputStamp()
	if ok, _ := stampMatches(dir, want); ok {
		return Result{Dir: dir}, nil
	}
	zip, err := Fetch(ctx, src.Pin)
	if err != nil {
		return Result{}, err
	}
	err = replaceDir(dir, func(tmp string) error {
		if err := Extract(src.Pin, zip, tmp); err != nil {
			return err
		}
		for _, p := range src.Patches {
			if err := applyPatch(tmp, p); err != nil {
				return err
			}
		}
		for _, f := range src.Overlay {
			if err := addOverlay(tmp, f); err != nil {
				return err
			}
		}
		return writeStamp(tmp, want)
	})
	if err != nil {
		return Result{}, err
	}
	return Result{Dir: dir, Rebuilt: true, Zip: zip}, nil
}

// Pristine makes dir an unpatched copy of the pinned release, verified like
// Build's, for running upstream's suite on the pristine tree.
func Pristine(ctx context.Context, pin Pin, dir string) error {
	zip, err := Fetch(ctx, pin)
	if err != nil {
		return err
	}
	return replaceDir(dir, func(tmp string) error { return Extract(pin, zip, tmp) })
}

// Fetch downloads the pinned module zip through the Go module proxy and
// returns its path in the module cache, after checking that its hash is the
// pinned one.
func Fetch(ctx context.Context, pin Pin) (string, error) {
	zip, got, err := FetchVersion(ctx, pin.Path, pin.Version)
	if err != nil {
		return "", err
	}
	if got != pin.Hash {
		return "", &HashMismatchError{Pin: pin, Got: got}
	}
	return zip, nil
}

// FetchVersion downloads path@version through the Go module proxy, as the
// go command does for any dependency (so GOPROXY, GOSUMDB and friends
// apply, and a version the checksum database does not vouch for is
// refused), and returns the zip's path in the module cache and its h1:
// hash, recomputed from the zip and checked against the go command's.
func FetchVersion(ctx context.Context, path, version string) (zip, hash string, err error) {
	// Run outside any module so that neither this repository's go.mod (and
	// its replace directive) nor a go.work can change what is fetched.
	scratch, err := os.MkdirTemp("", "upstreamtree-fetch-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(scratch)

	target := path + "@" + version
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", target)
	cmd.Dir = scratch
	cmd.Env = append(os.Environ(), "GO111MODULE=on", "GOWORK=off", "GOFLAGS=-mod=mod")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()

	var info struct{ Zip, Sum, Error string }
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil || info.Error != "" || runErr != nil {
		msg := strings.TrimSpace(info.Error)
		if msg == "" {
			msg = strings.TrimSpace(stderr.String())
		}
		if msg == "" && runErr != nil {
			msg = runErr.Error()
		}
		return "", "", fmt.Errorf("fetching %s through the Go module proxy: %s", target, msg)
	}
	got, err := dirhash.HashZip(info.Zip, dirhash.Hash1)
	if err != nil {
		return "", "", fmt.Errorf("hashing %s: %w", info.Zip, err)
	}
	if got != info.Sum {
		return "", "", fmt.Errorf("fetching %s: the zip in the module cache hashes to %s, but the go command says %s; clean the cache (go clean -modcache) and try again", target, got, info.Sum)
	}
	return info.Zip, got, nil
}

// HashMismatchError reports a fetched module whose hash is not the pinned one.
type HashMismatchError struct {
	Pin Pin
	Got string
}

func (e *HashMismatchError) Error() string {
	return fmt.Sprintf("refusing to vendor %s@%s: the module proxy served a zip that hashes to %s, but the pin says %s; "+
		"check upstream/PIN against the go.sum line of that release",
		e.Pin.Path, e.Pin.Version, e.Got, e.Pin.Hash)
}

// Extract unpacks a verified module zip of pin's module and version into
// dir, which must not exist yet.
func Extract(pin Pin, zip, dir string) error {
	if err := modzip.Unzip(dir, module.Version{Path: pin.Path, Version: pin.Version}, zip); err != nil {
		return fmt.Errorf("extracting %s@%s: %w", pin.Path, pin.Version, err)
	}
	return nil
}

// PatchError names the patch, file and hunk that failed to apply.
type PatchError struct {
	Patch string // patch file name
	File  string // file in the tree, empty when the patch itself is unreadable
	Hunk  int    // one-indexed hunk (fragment) number, 0 when unknown
	Range string // the hunk's "@@ -a,b +c,d @@" header, when known
	Err   error
}

func (e *PatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "patch %s", e.Patch)
	if e.File != "" {
		fmt.Fprintf(&b, ": file %s", e.File)
	}
	if e.Hunk > 0 {
		fmt.Fprintf(&b, ": hunk %d", e.Hunk)
		if e.Range != "" {
			fmt.Fprintf(&b, " (%s)", e.Range)
		}
	}
	fmt.Fprintf(&b, " does not apply: %v", e.Err)
	return b.String()
}

func (e *PatchError) Unwrap() error { return e.Err }

func applyPatch(root string, p File) error {
	files, _, err := gitdiff.Parse(bytes.NewReader(p.Data))
	if err != nil {
		return &PatchError{Patch: p.Name, Err: err}
	}
	if len(files) == 0 {
		return &PatchError{Patch: p.Name, Err: errors.New("it contains no file changes")}
	}
	for _, f := range files {
		if err := applyFile(root, f); err != nil {
			perr := &PatchError{Patch: p.Name, File: f.NewName, Err: err}
			if f.IsDelete {
				perr.File = f.OldName
			}
			var aerr *gitdiff.ApplyError
			if errors.As(err, &aerr) && aerr.Fragment > 0 && aerr.Fragment <= len(f.TextFragments) {
				frag := f.TextFragments[aerr.Fragment-1]
				perr.Hunk = aerr.Fragment
				perr.Range = fmt.Sprintf("@@ -%d,%d +%d,%d @@", frag.OldPosition, frag.OldLines, frag.NewPosition, frag.NewLines)
				perr.Err = aerr.Unwrap()
			}
			return perr
		}
	}
	return nil
}

func applyFile(root string, f *gitdiff.File) error {
	if f.IsBinary {
		return errors.New("binary patches are not supported")
	}
	var src []byte
	if !f.IsNew {
		var err error
		if src, err = os.ReadFile(inTree(root, f.OldName)); err != nil {
			return err
		}
	}
	var out bytes.Buffer
	if err := gitdiff.Apply(&out, bytes.NewReader(src), f); err != nil {
		return err
	}
	if f.IsDelete {
		return os.Remove(inTree(root, f.OldName))
	}
	if f.IsRename {
		if err := os.Remove(inTree(root, f.OldName)); err != nil {
			return err
		}
	}
	dst := inTree(root, f.NewName)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, out.Bytes(), 0o644)
}

func addOverlay(root string, f File) error {
	if f.Name != filepath.Base(f.Name) || strings.HasPrefix(f.Name, ".") {
		return fmt.Errorf("overlay file %q: want a plain file name", f.Name)
	}
	dst := filepath.Join(root, f.Name)
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("overlay file %s would replace an upstream file; change upstream files with a patch", f.Name)
	}
	return os.WriteFile(dst, f.Data, 0o644)
}

// inTree maps a slash-separated path from a patch into root, refusing paths
// that would leave it.
func inTree(root, name string) string {
	clean := filepath.Clean(filepath.FromSlash(name))
	if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
		// gitdiff has already rejected malformed names; this is a last guard.
		return filepath.Join(root, "invalid-path")
	}
	return filepath.Join(root, clean)
}

// treeHash hashes every file of the tree except the stamp itself, so that a
// hand-edited vendored tree is noticed and rebuilt.
func treeHash(dir string) (string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			if rel != StampFile {
				files = append(files, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	return dirhash.Hash1(files, func(name string) (io.ReadCloser, error) {
		return os.Open(filepath.Join(dir, filepath.FromSlash(name)))
	})
}

func writeStamp(dir, inputs string) error {
	tree, err := treeHash(dir)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, StampFile), []byte(inputs+"\ntree "+tree+"\n"), 0o644)
}

func stampMatches(dir, inputs string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, StampFile))
	if err != nil {
		return false, err
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 || lines[0] != inputs {
		return false, nil
	}
	tree, err := treeHash(dir)
	if err != nil {
		return false, err
	}
	return lines[1] == "tree "+tree, nil
}

// replaceDir builds a new tree in a scratch folder next to dir and swaps it
// in only when fill succeeds, so a failed build never leaves a half-patched
// tree behind.
func replaceDir(dir string, fill func(tmp string) error) error {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(parent, ".upstreamtree-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	tmp := filepath.Join(scratch, "tree")
	if err := fill(tmp); err != nil {
		return err
	}
	old := filepath.Join(scratch, "old")
	if _, err := os.Stat(dir); err == nil {
		if err := os.Rename(dir, old); err != nil {
			return err
		}
	}
	return os.Rename(tmp, dir)
}
