// Command amqp091-drainer builds the patched amqp091-go tree that
// amqp091-drainer ships.
//
// Usage:
//
//	amqp091-drainer vendor [-dir upstream/amqp091-go] [-pin FILE] [-pristine]
//
// vendor fetches the pinned amqp091-go release through the Go module proxy,
// verifies its hash, applies the patch set and adds the overlay files (both
// compiled into this command from upstream/), and stamps the result. Run it
// twice and the second run does nothing. With -pristine it extracts the
// verified release without patching it, for comparisons.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

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

const usage = `usage: amqp091-drainer vendor [-dir DIR] [-pin FILE] [-pristine]`

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "vendor":
		return vendor(ctx, args[1:], out)
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
