package relaycmd

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestVersionOfACheckout builds the relay as a developer does, with go
// build in a git checkout: a copy of this module committed to a fresh
// repository (Go records no commit for a linked worktree, which this
// checkout may be). `relay version` must print the commit, its time and,
// once the tree has a change, that it had uncommitted changes; built with
// -buildvcs=false it must say that nothing was recorded rather than
// "(devel)".
func TestVersionOfACheckout(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("git is required under CI: %v", err)
		}
		t.Skipf("git is not on PATH (%v): install it to test the version of a checkout", err)
	}
	dir := t.TempDir()
	copyModule(t, "..", dir)
	env := gitEnviron()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("add", "-A")
	git("-c", "user.name=Herald tests", "-c", "user.email=tests@example.com", "commit", "-q", "-m", "snapshot")
	rev := git("rev-parse", "HEAD")
	committed, err := time.Parse(time.RFC3339, git("show", "-s", "--format=%cI", "HEAD"))
	if err != nil {
		t.Fatal(err)
	}
	version := func(name string, flags ...string) string {
		t.Helper()
		bin := filepath.Join(t.TempDir(), name)
		build := exec.Command("go", append(append([]string{"build", "-trimpath"}, flags...), "-o", bin, "./cmd/relay")...)
		build.Dir, build.Env = dir, append(env, "GOFLAGS=")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s ./cmd/relay: %v\n%s", strings.Join(flags, " "), err, out)
		}
		out, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("%s version: %v\n%s", name, err, out)
		}
		return strings.TrimSpace(string(out))
	}

	clean := version("clean", "-buildvcs=true")
	want := "commit " + rev + ", " + committed.UTC().Format(time.RFC3339) + "; go"
	if !strings.HasPrefix(clean, "relay v0.0.0-") || !strings.Contains(clean, rev[:12]+" (") || !strings.Contains(clean, want) ||
		strings.Contains(clean, "uncommitted") || strings.Contains(clean, "devel") {
		t.Errorf("a clean checkout: %q, want its pseudo-version and %q", clean, want)
	}

	if err := os.WriteFile(filepath.Join(dir, "NOTES"), []byte("a change\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirty := version("dirty", "-buildvcs=true")
	if !strings.Contains(dirty, "+dirty (commit "+rev) || !strings.Contains(dirty, ", uncommitted changes; go") {
		t.Errorf("a checkout with a change: %q, want +dirty and uncommitted changes", dirty)
	}

	none := version("none", "-buildvcs=false")
	if none == "relay (devel)" || !strings.HasPrefix(none, "relay devel (no version or commit recorded: built with -buildvcs=false") {
		t.Errorf("built with -buildvcs=false: %q, want it to say nothing was recorded", none)
	}
	t.Logf("relay version:\n  %s\n  %s\n  %s", clean, dirty, none)
}

// copyModule copies the module at root to dir: its regular files, without
// version control data.
func copyModule(t *testing.T, root, dir string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.Name() == ".git" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil // a worktree's pointer to its repository
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	})
	if err != nil {
		t.Fatalf("copying the module: %v", err)
	}
}

// gitEnviron is the environment without the variables that would point
// git at another repository.
func gitEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			out = append(out, kv)
		}
	}
	return out
}
