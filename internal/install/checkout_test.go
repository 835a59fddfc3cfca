package install

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeCheckoutPath is the placeholder for the checkout in README.md's
// adoption command.
const readmeCheckoutPath = "/path/to/amqp091-drainer"

// TestCheckoutAdoptionLeavesCheckoutClean runs README.md's adoption command
// "from a checkout of this repository", exactly as printed there, from a
// scratch module outside the checkout, then its uninstall, and checks that
// neither leaves anything in the checkout: `git status --porcelain` is what
// it was before, and no go.work.sum appeared (that file is ignored, so git
// status alone would not show it). With the tree vendored it also runs the
// command without GOWORK=off, as a newcomer might once go.work can load,
// and asks the same.
func TestCheckoutAdoptionLeavesCheckoutClean(t *testing.T) {
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("needs git")
	}
	if err := exec.Command("git", "-C", repo, "rev-parse", "--git-dir").Run(); err != nil {
		t.Skip("not in a git checkout")
	}
	command := readmeCheckoutCommand(t, filepath.Join(repo, "README.md"))

	variants := []struct{ name, command string }{{"README", command}}
	if _, err := os.Stat(filepath.Join(repo, "upstream", "amqp091-go", "go.mod")); err == nil {
		variants = append(variants, struct{ name, command string }{"workspace", strings.TrimPrefix(command, "GOWORK=off ")})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			before := gitStatus(t, repo)
			workSum := filepath.Join(repo, "go.work.sum")
			_, statErr := os.Stat(workSum)
			hadWorkSum := statErr == nil

			user := newModule(t, "v1.16.0")
			for _, sub := range []string{"install", "uninstall"} {
				line := strings.Replace(v.command, " install ", " "+sub+" ", 1)
				out := runShell(t, user, repo, line)
				if !strings.Contains(out, "go.mod: wrote") {
					t.Errorf("%s did not change the scratch module:\n%s", sub, out)
				}
			}

			if after := gitStatus(t, repo); after != before {
				t.Errorf("the adoption command changed the checkout's git status:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if _, err := os.Stat(workSum); err == nil && !hadWorkSum {
				t.Errorf("the adoption command left %s in the checkout", workSum)
			}
		})
	}
}

// readmeCheckoutCommand returns the line of README.md that adopts the patched
// build from a checkout, so that this test runs what users are told to run.
func readmeCheckoutCommand(t *testing.T, readme string) string {
	t.Helper()
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.Contains(line, "go -C "+readmeCheckoutPath+" run ") && strings.Contains(line, " install ") {
			found = append(found, line)
		}
	}
	if len(found) != 1 {
		t.Fatalf("README.md: want one adoption command run from %s, found %q", readmeCheckoutPath, found)
	}
	return found[0]
}

// runShell runs line with sh in dir, the checkout's placeholder replaced by
// repo, in the environment a newcomer's shell would have: no GOWORK or
// GOFLAGS of the test's own.
func runShell(t *testing.T, dir, repo, line string) string {
	t.Helper()
	line = strings.ReplaceAll(line, readmeCheckoutPath, shellQuote(repo))
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "PWD=") {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, "PWD="+dir) // the command passes -module "$PWD"
	out, err := cmd.CombinedOutput()
	t.Logf("$ %s\n%s", line, out)
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return string(out)
}

// gitStatus is `git status --porcelain` of the checkout, untracked files
// listed one by one.
func gitStatus(t *testing.T, repo string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", repo, "status", "--porcelain", "--untracked-files=all").Output()
	if err != nil {
		t.Fatalf("git status: %v", err)
	}
	return string(out)
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
