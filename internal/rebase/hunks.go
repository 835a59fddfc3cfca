package rebase

import (
	"strings"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
)

// Status is what became of one hunk on the new release.
type Status int

const (
	// Exact: the hunk's old side stands where the patch says.
	Exact Status = iota
	// Moved: the hunk's old side stands, unchanged, some lines away.
	Moved
	// Merged: the hunk's old side is nowhere in the new file, but a
	// three-way merge of the whole file (git merge-file) took it without
	// conflict.
	Merged
	// Conflict: neither placing nor merging could take the hunk.
	Conflict
)

func (s Status) String() string {
	switch s {
	case Exact:
		return "exact"
	case Moved:
		return "moved"
	case Merged:
		return "merged 3-way"
	default:
		return "CONFLICT"
	}
}

// Hunk is the outcome of one hunk of one patch.
type Hunk struct {
	Patch  string // patch file name
	File   string // the file it changes
	Index  int    // one-indexed, in the order of the patch
	Header string // the hunk's "@@ -a,b +c,d @@ func" line in the old patch
	Status Status
	Offset int    // Moved: new line minus recorded line
	Detail string // Conflict: both sides, as git merge-file shows them
}

// splitLines splits s into lines that keep their "\n"; the last may lack
// one.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// sides returns a hunk's old side (context and deleted lines) and new side
// (context and added lines).
func sides(frag *gitdiff.TextFragment) (old, new []string) {
	for _, l := range frag.Lines {
		if l.Old() {
			old = append(old, l.Line)
		}
		if l.New() {
			new = append(new, l.Line)
		}
	}
	return old, new
}

// recordedStart is the zero-based index at which the patch says a hunk's
// old side starts. A hunk with no old side (lines added to an empty file,
// or with -U0) records the line after which it adds.
func recordedStart(frag *gitdiff.TextFragment) int {
	if frag.OldLines == 0 {
		return int(frag.OldPosition)
	}
	return int(frag.OldPosition) - 1
}

// locate returns the index nearest to want, and not before from, at which
// old stands whole in lines, or -1. Every line must match to the byte: a
// rebase never drops context to make a hunk fit (no fuzz).
func locate(lines, old []string, want, from int) int {
	last := len(lines) - len(old)
	if last < from {
		return -1
	}
	want = min(max(want, from), last)
	for d := 0; want-d >= from || want+d <= last; d++ {
		if at := want + d; at <= last && matchAt(lines, old, at) {
			return at
		}
		if at := want - d; d > 0 && at >= from && matchAt(lines, old, at) {
			return at
		}
	}
	return -1
}

func matchAt(lines, old []string, at int) bool {
	for i, l := range old {
		if lines[at+i] != l {
			return false
		}
	}
	return true
}

// place applies f's hunks to src, each at the nearest place where its old
// side stands unchanged. It returns the new text and an outcome per hunk;
// ok is false when some hunk stands nowhere (its Status is Conflict until
// a merge says otherwise).
func place(patch string, f *gitdiff.File, src string) (out string, hunks []Hunk, ok bool) {
	lines := splitLines(src)
	var b strings.Builder
	next, delta := 0, 0
	ok = true
	for i, frag := range f.TextFragments {
		old, new := sides(frag)
		h := Hunk{Patch: patch, File: f.NewName, Index: i + 1, Header: strings.TrimRight(frag.Header(), "\n")}
		recorded := recordedStart(frag)
		at := locate(lines, old, recorded+delta, next)
		if at < 0 {
			h.Status, ok = Conflict, false
			hunks = append(hunks, h)
			continue
		}
		h.Offset = at - recorded
		if h.Offset != 0 {
			h.Status = Moved
		}
		delta = h.Offset
		for _, l := range lines[next:at] {
			b.WriteString(l)
		}
		for _, l := range new {
			b.WriteString(l)
		}
		next = at + len(old)
		hunks = append(hunks, h)
	}
	for _, l := range lines[next:] {
		b.WriteString(l)
	}
	return b.String(), hunks, ok
}
