package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/heraldhq/herald/outbox"
)

// cluster is a throwaway PostgreSQL cluster owned by one test.
type cluster struct {
	dir, bin string
	port     int
	// logical: the server writes logical WAL, and the relays and the
	// producer use WAL capture.
	logical bool
	// asUser runs the server tools as this OS user (initdb refuses root).
	asUser string
}

// pgBinDir finds initdb and pg_ctl: on PATH, or in a Debian PostgreSQL
// directory. Under CI=true their absence fails the test; elsewhere it skips.
func pgBinDir(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p)
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1])
	}
	msg := "chaos: initdb and pg_ctl not found (on PATH or /usr/lib/postgresql/*/bin); install the PostgreSQL server"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// startCluster creates a cluster in a temporary directory on a free port
// of 127.0.0.1 and removes it when the test ends; logical makes it write
// logical WAL for WAL capture.
func startCluster(t *testing.T, logical bool) *cluster {
	t.Helper()
	c := &cluster{bin: pgBinDir(t), port: freePort(t), logical: logical}
	dir, err := os.MkdirTemp("", "herald-chaos-pg")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("chaos: running as root and there is no postgres user to run initdb as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.asUser = "postgres"
	}
	c.run(t, "initdb", "-D", c.data(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
	c.start(t)
	t.Cleanup(func() { c.stop(t, true) })
	return c
}

var _ database = (*cluster)(nil)

func (c *cluster) dialect() outbox.Dialect { return outbox.PostgreSQL }

func (c *cluster) relayCommand(config string) *exec.Cmd {
	return exec.Command(relayBin, "run", "--config", config)
}

func (c *cluster) walCapture() bool { return c.logical }

func (c *cluster) idText(col string) string { return col + "::text" }

func (c *cluster) quote(name string) string { return `"` + name + `"` }

// killRelayConns terminates the relays' backends, found by their
// application_name.
func (c *cluster) killRelayConns(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A connection of its own: the check's must not be the victim.
	conn := c.open(t, "chaos_terminator")
	defer conn.Close()
	var n int
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name LIKE $1) x`, relayAppPrefix+"%").Scan(&n); err != nil {
		t.Errorf("terminating relay connections: %v", err)
	}
	return n
}

func (c *cluster) data() string { return filepath.Join(c.dir, "data") }

// command returns the server tool name with args, as c.asUser when set.
func (c *cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, name)
	if c.asUser != "" {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	}
	return exec.CommandContext(ctx, path, args...)
}

func (c *cluster) run(t *testing.T, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := c.command(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("chaos: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (c *cluster) start(t *testing.T) {
	t.Helper()
	// fsync off: the server process may crash, the machine does not.
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", c.port, c.dir)
	if c.logical {
		opts += " -c wal_level=logical"
	}
	c.run(t, "pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"), "-o", opts, "-w", "-t", "60", "start")
}

// stop stops the server: fast (clean) or immediate (a crash).
func (c *cluster) stop(t *testing.T, crash bool) {
	t.Helper()
	mode := "fast"
	if crash {
		mode = "immediate"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.command(ctx, "pg_ctl", "-D", c.data(), "-m", mode, "-w", "stop").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Is server running?") {
		t.Errorf("chaos: pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
}

// url returns a connection string naming the session application_name.
func (c *cluster) url(appName string) string {
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable&application_name=%s",
		dbPassword, c.port, appName)
}

// dbPassword is in every relay's database URL (trust authentication ignores
// it) so the suite can check it never shows in their output.
const dbPassword = "Chaos-Db-Pa55word"

// open returns a handle for the test itself, closed when the test ends.
func (c *cluster) open(t *testing.T, name string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", c.url(name))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
