package toxi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

const (
	toxiproxyModule = "github.com/Shopify/toxiproxy/v2"
	serverPackage   = toxiproxyModule + "/cmd/server"
)

// serverBinary returns the path of a toxiproxy-server built from the
// version of Toxiproxy that go.mod requires, building it if needed. The
// go command found first in PATH is the one running the tests, because go
// test puts its GOROOT/bin first.
//
// Builds are cached in the module's git-ignored .cache/toxi, keyed by that
// version, so only the first test binary pays for one. Several test
// binaries may build at once (go test ./... runs packages in parallel):
// each builds in a directory of its own and renames the result into place,
// which is atomic, so none ever runs a half-written binary.
func serverBinary() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	version, cacheable, err := toxiproxyVersion(root)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, ".cache", "toxi")
	bin := filepath.Join(dir, "toxiproxy-server-"+version)
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && cacheable {
		return bin, nil
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, filepath.Base(bin))
	// -mod=readonly whatever GOFLAGS says: building a tool must never
	// rewrite go.mod.
	cmd := exec.Command("go", "build", "-mod=readonly", "-o", out, serverPackage)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("toxi: build %s@%s in %s: %v\n%s", serverPackage, version, root, err, msg)
	}
	if err := os.Rename(out, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// toxiproxyVersion returns the version of Toxiproxy that the go.mod in
// root requires, asking the go command because test binaries carry no
// dependency versions in their build info. It is not cacheable when go.mod
// replaces Toxiproxy with a directory, whose contents have no version.
func toxiproxyVersion(root string) (version string, cacheable bool, err error) {
	cmd := exec.Command("go", "list", "-mod=readonly", "-m",
		"-f", "{{.Version}}|{{with .Replace}}{{.Path}}@{{.Version}}{{end}}", toxiproxyModule)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%v: %s", err, ee.Stderr)
		}
		return "", false, fmt.Errorf("toxi: version of %s required in %s: %w", toxiproxyModule, root, err)
	}
	required, replace, _ := strings.Cut(strings.TrimSpace(string(out)), "|")
	if replace == "" {
		return required, true, nil
	}
	if _, v, _ := strings.Cut(replace, "@"); v != "" {
		return v, true, nil
	}
	return "devel", false, nil
}

// moduleRoot returns the directory of the go.mod that governs the current
// directory, which go test sets to the package's source directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("toxi: no go.mod above the working directory; run the tests with go test")
		}
		dir = parent
	}
}
