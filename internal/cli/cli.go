// Package cli is the amqp091-drainer command: vendor, install and
// uninstall. Two mains run it: cmd/amqp091-drainer, the module users run
// with `go run ...@VERSION`, and internal/bootstrap, which builds from the
// root module alone so that a fresh checkout can vendor the patched tree
// before the workspace that needs it can load.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/amqp091-drainer/amqp091-drainer/internal/install"
	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
	"github.com/amqp091-drainer/amqp091-drainer/upstream"
)

// Main runs the command with the process's arguments and exits non-zero
// on error.
func Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := Run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "amqp091-drainer:", err)
		stop()
		os.Exit(1)
	}
}

const usage = `usage:
  amqp091-drainer vendor [-dir DIR] [-pin FILE] [-pristine]
      build the patched amqp091-go tree (default upstream/amqp091-go)
  amqp091-drainer install [-dir DIR] [-module DIR]
      vendor the patched tree into your module (default third_party/amqp091-go)
      and point go.mod at it with a replace
  amqp091-drainer uninstall [-dir DIR] [-module DIR]
      drop that replace and remove the vendored tree`

// Run runs the command with args (without the program name), printing to
// out.
func Run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "vendor":
		return vendor(ctx, args[1:], out)
	case "install":
		return adopt(ctx, "install", install.Install, args[1:], out)
	case "uninstall":
		return adopt(ctx, "uninstall", install.Uninstall, args[1:], out)
	case "help", "-h", "-help", "--help":
		fmt.Fprintln(out, usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
}

func vendor(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vendor", flag.ContinueOnError)
	fs.SetOutput(out)
	dir := fs.String("dir", "upstream/amqp091-go", "where to build the tree")
	pinFile := fs.String("pin", "", "read the pin from this file instead of the built-in upstream/PIN")
	pristine := fs.Bool("pristine", false, "extract the verified release without patches or overlay")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pinData := upstream.Pin()
	if *pinFile != "" {
		var err error
		if pinData, err = os.ReadFile(*pinFile); err != nil {
			return err
		}
	}
	pin, err := upstreamtree.ParsePin(pinData)
	if err != nil {
		return err
	}
	if *pristine {
		if err := upstreamtree.Pristine(ctx, pin, *dir); err != nil {
			return err
		}
		fmt.Fprintf(out, "vendor: pristine %s@%s in %s\n", pin.Path, pin.Version, *dir)
		return nil
	}
	src := upstreamtree.Sources{Pin: pin}
	for _, f := range upstream.Patches() {
		src.Patches = append(src.Patches, upstreamtree.File(f))
	}
	for _, f := range upstream.Overlay() {
		src.Overlay = append(src.Overlay, upstreamtree.File(f))
	}
	res, err := upstreamtree.Build(ctx, src, *dir)
	if err != nil {
		return err
	}
	if !res.Rebuilt {
		fmt.Fprintf(out, "vendor: %s is up to date (%s@%s, %d patches, %d overlay files)\n",
			*dir, pin.Path, pin.Version, len(src.Patches), len(src.Overlay))
		return nil
	}
	fmt.Fprintf(out, "vendor: built %s from %s@%s (hash verified), %d patches, %d overlay files\n",
		*dir, pin.Path, pin.Version, len(src.Patches), len(src.Overlay))
	return nil
}

// adopt runs install or uninstall: both take the same flags and print their
// own lines as they go.
func adopt(ctx context.Context, name string, do func(context.Context, install.Options) (*install.Report, error), args []string, out io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	dir := fs.String("dir", install.DefaultDir, "the vendored tree's folder, relative to the module root")
	module := fs.String("module", "", "a folder inside the module to change (default: the current directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q\n%s", name, fs.Args(), usage)
	}
	opts := install.Options{Module: *module, Out: out}
	// An explicit -dir matters to uninstall: without one it also recognises
	// a tree installed elsewhere by its stamp.
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "dir" {
			opts.Dir = *dir
		}
	})
	_, err := do(ctx, opts)
	return err
}
