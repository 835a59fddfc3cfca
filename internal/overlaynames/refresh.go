package overlaynames

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
)

// Refresh lists the upstream names that the overlay of the checkout at root
// uses and returns doc (PATCHES.md) with that list between the markers,
// together with the list.
//
// The overlay files are upstream/_overlay/*.go, the patched tree is the
// vendored upstream/amqp091-go (which the caller brings up to date first),
// and the pristine release is the one upstream/PIN names, fetched and
// verified against the pin as `make vendor` does, so that the list never
// depends on whatever copy of the release happens to be in the module cache.
func Refresh(ctx context.Context, root string, doc []byte) ([]byte, []Name, error) {
	pin, err := upstreamtree.ReadPin(root)
	if err != nil {
		return nil, nil, err
	}
	scratch, err := os.MkdirTemp("", "overlaynames-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(scratch)
	pristineDir := filepath.Join(scratch, "pristine")
	if err := upstreamtree.Pristine(ctx, pin, pristineDir); err != nil {
		return nil, nil, err
	}
	pristine, err := Declared(pristineDir)
	if err != nil {
		return nil, nil, err
	}

	used, err := CheckoutUse(root, pristine)
	if err != nil {
		return nil, nil, err
	}
	updated, err := Replace(doc, Markdown(used))
	if err != nil {
		return nil, nil, err
	}
	return updated, used, nil
}

// CheckoutUse is Used for the checkout at root: its overlay files
// (upstream/_overlay/*.go) in its vendored tree (upstream/amqp091-go).
func CheckoutUse(root string, pristine map[Name]string) ([]Name, error) {
	paths, err := filepath.Glob(filepath.Join(root, "upstream", "_overlay", "*.go"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no overlay files in %s", filepath.Join(root, "upstream", "_overlay"))
	}
	overlay := make([]string, len(paths))
	for i, p := range paths {
		overlay[i] = filepath.Base(p)
	}
	return Used(filepath.Join(root, "upstream", "amqp091-go"), overlay, pristine)
}
