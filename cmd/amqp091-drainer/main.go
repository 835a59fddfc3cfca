// Command amqp091-drainer builds the patched amqp091-go tree that
// amqp091-drainer ships, and adopts it in (or removes it from) a user's
// module.
//
// Usage:
//
//	amqp091-drainer vendor [-dir upstream/amqp091-go] [-pin FILE] [-pristine]
//	amqp091-drainer install [-dir third_party/amqp091-go] [-module DIR]
//	amqp091-drainer uninstall [-dir third_party/amqp091-go] [-module DIR]
//
// vendor fetches the pinned amqp091-go release through the Go module proxy,
// verifies its hash, applies the patch set and adds the overlay files (both
// compiled into this command from upstream/), and stamps the result. Run it
// twice and the second run does nothing. With -pristine it extracts the
// verified release without patching it, for comparisons.
//
// install works on the module containing -module (default: the current
// directory): it refuses a module that does not require
// github.com/rabbitmq/amqp091-go, builds the patched tree into -dir
// (relative to the module root), sets the requirement to the pinned version
// (warning when that changes it) and adds
// `replace github.com/rabbitmq/amqp091-go => ./third_party/amqp091-go` to
// go.mod, one printed line per step. A second run finds everything in place
// and writes nothing. uninstall drops that replace and removes the folder;
// the requirement stays. The logic is in internal/install.
//
// From inside your module, run it at a released version with
//
//	go run github.com/amqp091-drainer/amqp091-drainer/cmd/amqp091-drainer@<version> install
//
// or from a checkout with
//
//	go -C /path/to/amqp091-drainer run ./cmd/amqp091-drainer install -module "$PWD"
//
// (`go run /path/to/amqp091-drainer/cmd/amqp091-drainer` from inside your
// module does not work: the go command refuses to build a package outside
// the current module). This command is a module of its own so that the
// @version form works: the go command refuses it for a module whose go.mod
// has replace directives, as the root module's must.
package main

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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "amqp091-drainer:", err)
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

func run(ctx context.Context, args []string, out io.Writer) error {
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
