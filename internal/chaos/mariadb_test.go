package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/outbox"
)

// mariadb is a throwaway MariaDB server owned by one test: a data directory
// made by mariadb-install-db in a temporary directory and mariadbd on a
// free port of 127.0.0.1, without grant tables, so that any user name is
// let in (with any password) and names its client in the process list.
type mariadb struct {
	dir, server string
	port        int
	// asRoot: mariadbd refuses to run as root unless told to.
	asRoot bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

var _ database = (*mariadb)(nil)

// mariadbBins finds mariadb-install-db and mariadbd: on PATH, or mariadbd in
// /usr/sbin. Under CI=true their absence fails the test; elsewhere it skips.
func mariadbBins(t *testing.T) (install, server string) {
	t.Helper()
	install, err := exec.LookPath("mariadb-install-db")
	if err == nil {
		if server, err = exec.LookPath("mariadbd"); err != nil {
			server, err = "/usr/sbin/mariadbd", nil
			if _, statErr := os.Stat(server); statErr != nil {
				err = statErr
			}
		}
	}
	if err != nil {
		msg := "chaos: mariadb-install-db and mariadbd not found (on PATH or /usr/sbin); install the MariaDB server"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return install, server
}

// startMariaDB creates a server in a temporary directory on a free port,
// with an empty database herald, and removes it when the test ends.
func startMariaDB(t *testing.T) *mariadb {
	t.Helper()
	install, server := mariadbBins(t)
	// The producer's and the check's connections break on purpose when the
	// server restarts; the driver would print each on the test's output.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	dir, err := os.MkdirTemp("", "herald-chaos-mariadb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	m := &mariadb{dir: dir, server: server, port: freePort(t), asRoot: os.Geteuid() == 0}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, install, "--no-defaults", "--datadir="+m.data(), "--user="+u.Username,
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		t.Fatalf("chaos: mariadb-install-db: %v\n%s", err, out)
	}
	m.start(t)
	t.Cleanup(func() { m.stop(t, true) })
	root := m.open(t, "root")
	if _, err := root.Exec("CREATE DATABASE herald CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		t.Fatalf("chaos: creating the database: %v", err)
	}
	root.Close()
	return m
}

func (m *mariadb) data() string { return filepath.Join(m.dir, "data") }

// start runs mariadbd and waits until it answers.
func (m *mariadb) start(t *testing.T) {
	t.Helper()
	args := []string{"--no-defaults", "--datadir=" + m.data(), fmt.Sprintf("--port=%d", m.port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(m.dir, "sock"), "--pid-file=" + filepath.Join(m.dir, "pid"),
		"--log-error=" + filepath.Join(m.dir, "server.log"), "--skip-grant-tables", "--max-connections=200",
		// The log reaches the OS at each commit: the server process may
		// crash, the machine does not.
		"--innodb-flush-log-at-trx-commit=2"}
	if m.asRoot {
		args = append(args, "--user=root")
	}
	cmd := exec.Command(m.server, args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("chaos: starting mariadbd: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()

	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User = "tcp", fmt.Sprintf("127.0.0.1:%d", m.port), "root"
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(m.dir, "server.log"))
			t.Fatalf("chaos: mariadbd exited while starting:\n%s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("chaos: mariadbd did not answer within a minute: %v", err)
		}
	}
}

// stop stops the server: SIGTERM and a clean shutdown, or SIGKILL (a crash).
func (m *mariadb) stop(t *testing.T, crash bool) {
	t.Helper()
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	sig := syscall.SIGTERM
	if crash {
		sig = syscall.SIGKILL
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("chaos: mariadbd did not stop within a minute of %v", sig)
	}
}

func (m *mariadb) url(name string) string {
	return fmt.Sprintf("mysql://%s:%s@127.0.0.1:%d/herald", name, dbPassword, m.port)
}

// open returns a handle for the test itself, closed when the test ends.
func (m *mariadb) open(t *testing.T, name string) *sql.DB {
	t.Helper()
	u := m.url(name)
	if name == "root" {
		u = fmt.Sprintf("mysql://root@127.0.0.1:%d/", m.port)
	}
	db, err := mysqlurl.Open(u)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}

func (m *mariadb) dialect() outbox.Dialect { return outbox.MySQL }

func (m *mariadb) walCapture() bool { return false }

func (m *mariadb) relayCommand(config string) *exec.Cmd {
	return exec.Command(relayBin, "run", "--config", config)
}

func (m *mariadb) idText(col string) string { return col }

func (m *mariadb) quote(name string) string { return "`" + name + "`" }

// killRelayConns kills the relays' connections, found by their user name.
func (m *mariadb) killRelayConns(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	root := m.open(t, "root")
	defer root.Close()
	rows, err := root.QueryContext(ctx, `SELECT id FROM information_schema.processlist WHERE user LIKE ?`, relayAppPrefix+"%")
	if err != nil {
		t.Errorf("listing relay connections: %v", err)
		return 0
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Errorf("listing relay connections: %v", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	killed := 0
	for _, id := range ids {
		_, err := root.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
		var myErr *mysql.MySQLError
		switch {
		case err == nil:
			killed++
		case errors.As(err, &myErr) && myErr.Number == 1094:
			// The connection ended meanwhile.
		default:
			t.Errorf("killing relay connection %d: %v", id, err)
		}
	}
	return killed
}
