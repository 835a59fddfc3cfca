package rebase

import (
	"fmt"
	"io"
	"strings"

	"github.com/amqp091-drainer/amqp091-drainer/internal/overlaynames"
)

// linef writes one line of the report.
type linef func(format string, args ...any)

// Print writes the report: the release, each hunk, the patch files, the
// drift guards, the upstream names the overlay uses, the verification
// steps, and a verdict with what to do next. Each section is left out when
// the run did not get that far.
func (r *Report) Print(w io.Writer) {
	p := linef(func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) })
	p("")
	p("== rebase report: %s %s -> %s", modulePath, r.From.Version, r.To.Version)
	if r.To.Hash != "" {
		p("release: %s (hash from the Go module proxy, checked against the checksum database "+
			"by the go command and recomputed from the zip)", r.To)
	}
	r.printHunks(p)
	r.printPatches(p)
	if r.Applied() {
		r.printDrift(p)
	}
	r.printNames(p)
	r.printSteps(p)
	r.printFiles(p)
	p("")
	r.printVerdict(p)
}

// printHunks lists each hunk with where it landed, and both sides of a
// conflict.
func (r *Report) printHunks(p linef) {
	if len(r.Hunks) == 0 {
		return
	}
	p("")
	counts := map[Status]int{}
	for _, h := range r.Hunks {
		counts[h.Status]++
	}
	p("-- hunks: %d exact, %d moved, %d merged 3-way, %d conflicting",
		counts[Exact], counts[Moved], counts[Merged], counts[Conflict])
	for _, h := range r.Hunks {
		status := h.Status.String()
		if h.Status == Moved {
			status = fmt.Sprintf("moved %+d", h.Offset)
		}
		p("  %-30s %-13s hunk %-2d %-12s %s", h.Patch, h.File, h.Index, status, h.Header)
		if h.Detail != "" {
			p("      ours (the patched %s) | base (%s) | theirs (%s):",
				r.From.Version, r.From.Version, r.To.Version)
			for _, l := range strings.Split(strings.TrimRight(h.Detail, "\n"), "\n") {
				p("      %s", l)
			}
		}
	}
}

// printPatches compares each rewritten patch file with the committed one.
func (r *Report) printPatches(p linef) {
	if len(r.Patches) == 0 {
		return
	}
	p("")
	p("-- patch files (rewritten by git format-patch, each with its author, date and message)")
	for _, pf := range r.Patches {
		if pf.Same {
			p("  %-34s identical to the committed file", pf.Name)
		} else {
			p("  %-34s changed: %s", pf.Name, pf.Changed)
		}
	}
}

// printDrift lists the guarded upstream functions the release changed,
// each with upstream's diff and whether its fingerprint was accepted.
func (r *Report) printDrift(p linef) {
	p("")
	if len(r.Drift) == 0 {
		p("-- drift guards (upstream/guards.txt): every guarded upstream function is unchanged at %s",
			r.To.Version)
		return
	}
	p("-- drift guards (upstream/guards.txt): %d to review", len(r.Drift))
	for _, d := range r.Drift {
		state := "NOT ACCEPTED"
		if d.Accepted {
			state = "accepted: fingerprint recorded"
		}
		p("  [%s] %s", state, d.Finding.Error())
		for _, l := range strings.Split(strings.TrimRight(d.Diff, "\n"), "\n") {
			if l != "" {
				p("      %s", l)
			}
		}
	}
}

// printNames lists how the upstream names the overlay uses moved.
func (r *Report) printNames(p linef) {
	if !r.Names.Checked {
		return
	}
	n := r.Names
	p("")
	p("-- upstream names the overlay uses: %d (list rewritten in PATCHES.md)", n.Total)
	p("  changed by %s: %s", r.To.Version, names(n.Changed))
	p("  removed by %s: %s", r.To.Version, names(n.Removed))
	p("  newly used: %s", names(n.Added))
	p("  no longer used: %s", names(n.Dropped))
}

// printSteps lists each verification step with its outcome and the tail
// of its output.
func (r *Report) printSteps(p linef) {
	if len(r.Steps) == 0 {
		return
	}
	p("")
	p("-- verification")
	for _, s := range r.Steps {
		state := "FAILED"
		if s.OK {
			state = "ok"
		}
		p("  %-6s %s (%s)", state, s.Name, s.Duration)
		for _, l := range strings.Split(s.Tail, "\n") {
			if l != "" {
				p("         %s", l)
			}
		}
	}
}

// printFiles lists the files rewritten, and those that still name the old
// release.
func (r *Report) printFiles(p linef) {
	if len(r.Written) > 0 {
		p("")
		p("-- files rewritten: %s", strings.Join(r.Written, ", "))
	}
	if len(r.Mentions) > 0 {
		p("-- files that still mention %s (read each: measurements and history rightly keep it): %s",
			r.From.Version, strings.Join(r.Mentions, ", "))
	}
}

// printVerdict says how the run ended and what to do next.
func (r *Report) printVerdict(p linef) {
	from, to := r.From.Version, r.To.Version
	switch {
	case r.Err != nil:
		p("VERDICT: stopped: %v", r.Err)
		if len(r.Written) > 0 {
			p("Files were rewritten before it stopped; `git checkout -- .` goes back.")
		}
	case !r.Applied():
		p("VERDICT: %s does not apply; nothing was written. Resolve each conflict above in the "+
			"patch files (or the overlay), then run the rebase again.", to)
	case r.DryRun && len(r.Drift) == 0:
		p("VERDICT: dry run: %s applies, and no guarded upstream function changed; nothing was "+
			"written. scripts/rebase %s does it.", to, to)
	case r.DryRun:
		p("VERDICT: dry run: %s applies; review the drift above. Nothing was written. "+
			"scripts/rebase %s does it, and --accept-drift records the fingerprints after the "+
			"review.", to, to)
	case r.OK():
		p("VERDICT: rebased onto %s. Commit the files above with the note's figures; upstream's "+
			"whole suite in every mode: make rebase VERSION=%s FULL=1, or scripts/test.", to, to)
	default:
		p("VERDICT: %s applies, but the rebase is not complete: see the FAILED steps and the "+
			"drift to review above.", to)
		p("After the review: scripts/rebase --accept-drift %s records the new fingerprints. "+
			"`git checkout -- .` goes back to %s.", to, from)
	}
}

func names(list []overlaynames.Name) string {
	if len(list) == 0 {
		return "none"
	}
	s := make([]string, len(list))
	for i, n := range list {
		s[i] = n.String()
	}
	return strings.Join(s, ", ")
}
