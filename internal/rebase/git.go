package rebase

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
)

// git runs git in dir with the maintainer's own configuration shut out,
// so that the patches it writes and the merges it makes are the same on
// every machine (no diff.noprefix, format.signature or merge.conflictStyle
// of anyone's).
func git(ctx context.Context, dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C",
		"GIT_COMMITTER_NAME=amqp091-drainer rebase", "GIT_COMMITTER_EMAIL=rebase@amqp091-drainer.invalid",
		"GIT_COMMITTER_DATE=2000-01-01T00:00:00Z",
		"GIT_AUTHOR_NAME=amqp091-drainer rebase", "GIT_AUTHOR_EMAIL=rebase@amqp091-drainer.invalid",
		"GIT_AUTHOR_DATE=2000-01-01T00:00:00Z")
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return nil, fmt.Errorf("git %s: %w (is git installed?)", args[0], err)
		}
		return stdout.Bytes(), &gitError{args: args, code: exit.ExitCode(), stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

type gitError struct {
	args   []string
	code   int
	stderr string
}

func (e *gitError) Error() string {
	return fmt.Sprintf("git %s: exit %d: %s", strings.Join(e.args, " "), e.code, e.stderr)
}

// merge3 merges into theirs (the file of the new release before this
// patch) the change that the patch made from base (the old release's file
// before it) to ours (after it). It returns the merged text and, when it
// conflicts, each conflict with both sides and the base between them.
func merge3(ctx context.Context, scratch, name string, base, ours, theirs string, oldVersion, newVersion string) (merged string, conflicts []string, err error) {
	dir, err := os.MkdirTemp(scratch, "merge-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(dir)
	for f, text := range map[string]string{"base": base, "ours": ours, "theirs": theirs} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
			return "", nil, err
		}
	}
	out, err := git(ctx, dir, nil, "merge-file", "-p", "--diff3",
		"-L", name+" patched at "+oldVersion, "-L", name+" at "+oldVersion, "-L", name+" at "+newVersion,
		"ours", "base", "theirs")
	var gerr *gitError
	if errors.As(err, &gerr) && gerr.code > 0 && gerr.code < 128 {
		// merge-file exits with the number of conflicts.
		return string(out), conflictRegions(string(out)), nil
	}
	if err != nil {
		return "", nil, err
	}
	return string(out), nil, nil
}

// conflictRegions cuts git's conflict markers out of merged text, each
// region with the three lines before and after it.
func conflictRegions(merged string) []string {
	lines := splitLines(merged)
	var regions []string
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "<<<<<<< ") {
			continue
		}
		end := i
		for end < len(lines) && !strings.HasPrefix(lines[end], ">>>>>>> ") {
			end++
		}
		from, to := max(i-3, 0), min(end+4, len(lines))
		regions = append(regions, strings.Join(lines[from:to], ""))
		i = end
	}
	return regions
}

// formatPatches writes the patch files anew: a scratch repository holds the
// new release's files that the patches touch, each patch becomes one
// commit with its original author, date and message, and git format-patch
// prints it. states[0] is the release, states[i] the files after patch i.
func formatPatches(ctx context.Context, scratch string, states []map[string]string, headers []*gitdiff.PatchHeader) ([][]byte, error) {
	dir, err := os.MkdirTemp(scratch, "format-")
	if err != nil {
		return nil, err
	}
	if _, err := git(ctx, dir, nil, "init", "-q"); err != nil {
		return nil, err
	}
	var out [][]byte
	for i, state := range states {
		names := make([]string, 0, len(state))
		for name := range state {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			p := filepath.Join(dir, filepath.FromSlash(name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(p, []byte(state[name]), 0o644); err != nil {
				return nil, err
			}
		}
		if _, err := git(ctx, dir, nil, "add", "-A"); err != nil {
			return nil, err
		}
		if i == 0 {
			if _, err := git(ctx, dir, nil, "commit", "-q", "-m", "release"); err != nil {
				return nil, err
			}
			continue
		}
		h := headers[i-1]
		env := []string{
			"GIT_AUTHOR_NAME=" + h.Author.Name, "GIT_AUTHOR_EMAIL=" + h.Author.Email,
			"GIT_AUTHOR_DATE=" + h.AuthorDate.Format(time.RFC3339),
		}
		if _, err := git(ctx, dir, env, "commit", "-q", "--allow-empty", "--cleanup=verbatim", "-m", h.Message()); err != nil {
			return nil, err
		}
		patch, err := git(ctx, dir, nil, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "HEAD")
		if err != nil {
			return nil, err
		}
		out = append(out, patch)
	}
	return out, nil
}
