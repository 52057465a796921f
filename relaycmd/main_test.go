package relaycmd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
)

// relayBin is the relay binary built once for the tests.
var relayBin string

const testVersion = "v0.0.0-test"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "relay-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	relayBin = filepath.Join(dir, "relay")
	build := exec.Command("go", "build", "-trimpath", "-o", relayBin, "-ldflags", "-X main.version="+testVersion, "github.com/heraldhq/herald/cmd/relay")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building relay:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is a finished relay process.
type result struct {
	stdout, stderr string
	code           int
}

// environ is the test process's environment without DATABASE_URL, plus env.
func environ(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

// runRelay runs the binary to completion (within a minute).
func runRelay(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, args...)
	cmd.Env = environ(env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("running relay %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// process is a relay running in the background; its output lines arrive on
// channels and are kept.
type process struct {
	cmd    *exec.Cmd
	stdout chan string
	stderr chan string
	mu     sync.Mutex
	logs   []string
	done   chan struct{}
	code   int
}

func start(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	return startIn(t, "", env, args...)
}

// startIn starts the relay in dir ("": the test's own directory).
func startIn(t *testing.T, dir string, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(relayBin, args...)
	cmd.Dir = dir
	cmd.Env = environ(env...)
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, stdout: make(chan string, 1000), stderr: make(chan string, 1000), done: make(chan struct{})}
	var readers sync.WaitGroup
	read := func(r io.Reader, ch chan string) {
		defer readers.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.logs = append(p.logs, sc.Text())
			p.mu.Unlock()
			select {
			case ch <- sc.Text():
			default:
			}
		}
	}
	readers.Add(2)
	go read(outPipe, p.stdout)
	go read(errPipe, p.stderr)
	go func() {
		readers.Wait()
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitLine waits for a line containing s on ch.
func (p *process) waitLine(t *testing.T, ch chan string, s string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line := <-ch:
			if strings.Contains(line, s) {
				return line
			}
		case <-p.done:
			t.Fatalf("relay exited (code %d) before writing %q; output:\n%s", p.code, s, p.output())
		case <-deadline:
			t.Fatalf("no line containing %q within %s; output:\n%s", s, timeout, p.output())
		}
	}
}

// stop sends SIGTERM and returns the exit code.
func (p *process) stop(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		return p.code
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not stop within 30s of SIGTERM; output:\n%s", p.output())
		return 0
	}
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.logs, "\n")
}

// dbURL returns the test database URL with a password in it (trust
// authentication ignores it), so tests can check it is never printed, and
// the password.
func dbURL(t *testing.T) (string, string) {
	t.Helper()
	raw := pgtest.URL(t)
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		t.Fatalf("test database URL is not a postgres:// URL with a user: %s", raw)
	}
	if p, ok := u.User.Password(); ok {
		return raw, p
	}
	const password = "Cli-Test-Pa55word"
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String(), password
}

// schema returns a fresh schema name, dropped when the test ends.
func schema(t *testing.T) string {
	t.Helper()
	pool := pgtest.Pool(t)
	name := pgtest.UniqueName("relay_cli")
	t.Cleanup(func() { pgtest.DropSchema(t, pool, name) })
	return name
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
