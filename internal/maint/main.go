// Command maint holds the maintainers' commands for following upstream,
// run from the checkout's root by the scripts named after them:
//
//	scripts/rebase [--accept-drift] [--full] [--dry-run] VERSION
//	    move to a new amqp091-go release (internal/rebase)
//	scripts/drift [--accept]
//	    check, or record, the drift guards' fingerprints (internal/drift)
//	scripts/overlay-names [--check]
//	    rewrite, or check, PATCHES.md's list of upstream names the overlay uses
//	go run ./internal/maint overlay-size [-check]
//	    print the overlay's code lines against their budget, its comment share, its lines
//	    over 100 characters and its functions over 60 lines (-check: fail on a rule broken)
//	go run ./internal/maint func-length [-check]
//	    print the functions over 60 lines in failover/, compat/ and internal/ (-check: fail
//	    on one)
//	go run ./internal/maint latest
//	    print the newest release on the module proxy, and the pinned one
//
// It builds from the root module alone (GOWORK=off), as internal/bootstrap
// does, so that it runs before the vendored tree exists.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"

	"golang.org/x/mod/semver"

	"github.com/amqp091-drainer/amqp091-drainer/internal/drift"
	"github.com/amqp091-drainer/amqp091-drainer/internal/overlaynames"
	"github.com/amqp091-drainer/amqp091-drainer/internal/overlaysize"
	"github.com/amqp091-drainer/amqp091-drainer/internal/rebase"
	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
)

const usage = `usage (from the checkout's root):
  maint rebase [-accept-drift] [-full] [-dry-run] [-report FILE] VERSION
  maint drift [-accept]
  maint overlay-names [-check]
  maint overlay-size [-check]
  maint func-length [-check]
  maint latest`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if len(os.Args) < 2 {
		fail(errors.New(usage))
	}
	var err error
	switch os.Args[1] {
	case "rebase":
		err = runRebase(ctx, os.Args[2:])
	case "drift":
		err = runDrift(ctx, os.Args[2:])
	case "overlay-names":
		err = runNames(ctx, os.Args[2:])
	case "overlay-size":
		err = runSize(os.Args[2:])
	case "func-length":
		err = runFuncLength(os.Args[2:])
	case "latest":
		err = runLatest(ctx)
	default:
		err = fmt.Errorf("unknown command %q\n%s", os.Args[1], usage)
	}
	if err != nil {
		stop()
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "maint:", err)
	os.Exit(1)
}

// errIncomplete ends a command whose report already said what is wrong.
var errIncomplete = errors.New("see the report above")

func runRebase(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rebase", flag.ContinueOnError)
	accept := fs.Bool("accept-drift", false, "record the new fingerprints of the guarded upstream "+
		"functions the release changed (after reviewing them)")
	full := fs.Bool("full", false, "also run upstream's whole suite, pristine and in every read mode "+
		"(needs RabbitMQ)")
	dryRun := fs.Bool("dry-run", false, "report what the release would change, and write nothing")
	reportFile := fs.String("report", "",
		"also write the report here (default .cache/rebase/report-VERSION.txt)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New(usage)
	}
	version := fs.Arg(0)
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	rep := rebase.Run(ctx, rebase.Options{Root: root, Version: version, AcceptDrift: *accept,
		Full: *full, DryRun: *dryRun, Log: os.Stderr})
	var buf bytes.Buffer
	rep.Print(&buf)
	os.Stdout.Write(buf.Bytes())
	path := *reportFile
	if path == "" {
		path = filepath.Join(root, ".cache", "rebase", "report-"+version+".txt")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err == nil {
			fmt.Fprintf(os.Stderr, "rebase: report saved in %s\n", path)
		}
	}
	if !rep.OK() {
		return errIncomplete
	}
	return nil
}

func runDrift(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("drift", flag.ContinueOnError)
	accept := fs.Bool("accept", false,
		"record the fingerprints of the pinned release (after reviewing its changes)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if *accept {
		if err := drift.AcceptPinned(ctx, root); err != nil {
			return err
		}
		fmt.Println("drift: fingerprints of the pinned release recorded in upstream/guards.txt")
	}
	version, guards, found, err := drift.Pinned(ctx, root)
	if err != nil {
		return err
	}
	for _, f := range found {
		fmt.Println("drift:", f.Error())
	}
	if len(found) > 0 {
		return fmt.Errorf("%d of %d guards differ from upstream %s", len(found), len(guards), version)
	}
	fmt.Printf("drift: all %d guarded upstream functions are as fingerprinted at %s\n",
		len(guards), version)
	return nil
}

func runNames(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("overlay-names", flag.ContinueOnError)
	check := fs.Bool("check", false,
		"exit non-zero when PATCHES.md's list is out of date, instead of rewriting it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	doc := filepath.Join(root, "PATCHES.md")
	data, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	updated, used, err := overlaynames.Refresh(ctx, root, data)
	if err != nil {
		return err
	}
	switch {
	case bytes.Equal(updated, data):
		fmt.Printf("overlay-names: PATCHES.md lists the %d upstream names the overlay uses\n", len(used))
		return nil
	case *check:
		return errors.New("PATCHES.md's list of the upstream names the overlay uses is out of date: " +
			"run scripts/overlay-names")
	}
	if err := os.WriteFile(doc, updated, 0o644); err != nil {
		return err
	}
	fmt.Printf("overlay-names: PATCHES.md now lists the %d upstream names the overlay uses\n",
		len(used))
	return nil
}

// runLatest prints the newest release of amqp091-go on the module proxy
// and the pinned one, as "latest=vX pinned=vY newer=true|false", for the
// canary (scripts/canary).
func runLatest(ctx context.Context) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	pin, err := upstreamtree.ReadPin(root)
	if err != nil {
		return err
	}
	scratch, err := os.MkdirTemp("", "amqp091-latest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-json", pin.Path+"@latest")
	cmd.Dir = scratch
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("asking the module proxy for %s@latest: %v: %s",
			pin.Path, err, strings.TrimSpace(stderr.String()))
	}
	var info struct{ Version string }
	if err := json.Unmarshal(out, &info); err != nil {
		return err
	}
	newer := semver.Compare(info.Version, pin.Version) > 0
	fmt.Printf("latest=%s pinned=%s newer=%t\n", info.Version, pin.Version, newer)
	return nil
}

// runSize prints the overlay's size, its lines over overlaysize.MaxWidth
// and its functions over overlaysize.MaxFuncLines; -check fails when the
// overlay breaks one of overlaysize's rules (Report.Check).
func runSize(args []string) error {
	fs := flag.NewFlagSet("overlay-size", flag.ContinueOnError)
	check := fs.Bool("check", false, "exit non-zero when the overlay is over its code budget, "+
		"has too many long lines, or a function other than a table over the bound")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := overlaysize.Measure(filepath.Join("upstream", "_overlay"))
	if err != nil {
		return err
	}
	fmt.Print(r)
	if *check {
		return r.Check()
	}
	return nil
}

// runFuncLength prints the functions over overlaysize.MaxFuncLines in the
// module's folders of overlaysize.TreeDirs, tables aside; -check fails on
// one.
func runFuncLength(args []string) error {
	fs := flag.NewFlagSet("func-length", flag.ContinueOnError)
	check := fs.Bool("check", false,
		"exit non-zero when a function other than a table is over the bound")
	if err := fs.Parse(args); err != nil {
		return err
	}
	long, err := overlaysize.Tree(".", overlaysize.TreeDirs...)
	if err != nil {
		return err
	}
	where := strings.Join(overlaysize.TreeDirs, "/, ") + "/"
	if len(long) == 0 {
		fmt.Printf("functions over %d lines in %s: none\n", overlaysize.MaxFuncLines, where)
		return nil
	}
	fmt.Printf("functions over %d lines in %s: %d\n", overlaysize.MaxFuncLines, where, len(long))
	for _, f := range long {
		fmt.Printf("  %4d %s (%s:%d)\n", f.Lines, f.Name, f.File, f.Line)
	}
	if *check {
		return fmt.Errorf("%d functions are over %d lines: split them into named steps "+
			"(or name a table in overlaysize.TreeTables, with the reason)",
			len(long), overlaysize.MaxFuncLines)
	}
	return nil
}
