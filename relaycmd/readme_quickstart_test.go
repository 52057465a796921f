package relaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
)

// postgresTool checks that a PostgreSQL client program (createdb, psql) is
// on PATH: missing, the test fails under CI=true and skips otherwise.
func postgresTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		msg := name + " is not on PATH: install PostgreSQL's client programs (apt-get install postgresql-client)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// quickStart is the README's PostgreSQL quick start, block by block.
type quickStart struct {
	setup  []string // the first sh block's lines, comments removed
	config string   // herald.yaml
	run    string   // the relay run line
	insert string   // the SQL transaction
	output string   // the line the relay prints
}

func readmeQuickStart(t *testing.T) quickStart {
	t.Helper()
	_, section, ok := strings.Cut(readme(t), "\n## Quick start (PostgreSQL)\n")
	if !ok {
		t.Fatal("README: no ## Quick start (PostgreSQL) section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	blocks := map[string][]string{}
	for _, m := range fencedBlock.FindAllStringSubmatch(section, -1) {
		blocks[m[1]] = append(blocks[m[1]], m[2])
	}
	if len(blocks["sh"]) < 2 || len(blocks["yaml"]) != 1 || len(blocks["sql"]) != 1 || len(blocks["json"]) != 1 {
		t.Fatalf("README's quick start: want sh blocks (setup, relay run), one YAML, one SQL and one JSON block, got %d, %d, %d, %d",
			len(blocks["sh"]), len(blocks["yaml"]), len(blocks["sql"]), len(blocks["json"]))
	}
	var q quickStart
	for _, line := range strings.Split(blocks["sh"][0], "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			q.setup = append(q.setup, line)
		}
	}
	q.run, _, _ = strings.Cut(blocks["sh"][1], "#")
	q.run = strings.TrimSpace(q.run)
	q.config, q.insert, q.output = blocks["yaml"][0], blocks["sql"][0], strings.TrimSpace(blocks["json"][0])
	return q
}

// TestREADMEQuickStart runs the README's PostgreSQL quick start as a
// reader would: createdb and relay migrate up as written (the database
// name made unique, and host, port and user those of the test server),
// herald.yaml as written (the admin server moved to a free port: other
// relays run on this machine), relay run, then the SQL transaction
// through psql while the relay runs. The relay must print the event as
// the README shows it (its id and time aside), and the transaction's
// pg_notify must reach a listener on the channel the relay listens on.
func TestREADMEQuickStart(t *testing.T) {
	t.Parallel()
	postgresTool(t, "createdb") // the quick start runs both as written
	postgresTool(t, "psql")
	q := readmeQuickStart(t)
	wantSetup := []string{"createdb -h 127.0.0.1 -U postgres shop", "export DATABASE_URL='postgres://postgres@127.0.0.1:5432/shop?sslmode=disable'", "relay migrate up"}
	if !slices.Equal(q.setup, wantSetup) {
		t.Fatalf("README's quick start sets up with %q; this test runs %q", q.setup, wantSetup)
	}
	if q.run != "relay run --config herald.yaml" {
		t.Fatalf("README's quick start runs %q; this test runs relay run --config herald.yaml", q.run)
	}

	// The test server, and a database of the test's own on it.
	server, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	name := pgtest.UniqueName("herald_quickstart")
	pool := pgtest.Pool(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping the quick start's database: %v", err)
		}
	})
	host, port := server.Hostname(), server.Port()
	if port == "" {
		port = "5432"
	}
	user := server.User.Username()
	setup := strings.Join(q.setup, "\n")
	setup = strings.ReplaceAll(setup, "shop", name)
	setup = strings.Replace(setup, "-h 127.0.0.1 -U postgres", fmt.Sprintf("-h %s -p %s -U %s", host, port, user), 1)
	setup = strings.Replace(setup, "postgres@127.0.0.1:5432", fmt.Sprintf("%s@%s:%s", user, host, port), 1)
	dir := t.TempDir()
	r := runShell(t, dir, nil, "set -e\n"+setup)
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("applied %03d_", migrations.Latest())) {
		t.Fatalf("the quick start's setup:\n%s\n%s", setup, r)
	}
	dbURL := strings.Replace(server.String(), server.Path, "/"+name, 1)

	if err := os.WriteFile(filepath.Join(dir, "herald.yaml"), []byte(q.config+"admin: {listen: \"127.0.0.1:0\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startIn(t, dir, []string{"DATABASE_URL=" + dbURL}, "run", "--config", "herald.yaml")
	p.waitLine(t, p.stderr, "relay: started", time.Minute)

	// A listener on the channel the relay listens on, in the same
	// database: the README's pg_notify must reach it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	listener, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	channel := migrations.Tables{}.WithDefaults().Channel()
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(q.insert, "pg_notify('"+channel+"', '')") {
		t.Fatalf("README's quick start SQL does not notify %s, the channel of the default table:\n%s", channel, q.insert)
	}

	r = runShell(t, dir, []string{"DATABASE_URL=" + dbURL}, `psql "$DATABASE_URL" -v ON_ERROR_STOP=1 <<'SQL'`+"\n"+q.insert+"SQL\n")
	if r.code != 0 {
		t.Fatalf("the quick start's SQL through psql:\n%s", r)
	}
	if n, err := listener.WaitForNotification(ctx); err != nil || n.Channel != channel {
		t.Fatalf("no notification on %s after the README's transaction: %v %+v", channel, err, n)
	}
	line := p.waitLine(t, p.stdout, `"topic":"orders.paid"`, time.Minute)

	var got, want map[string]any
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("the relay printed %q: %v", line, err)
	}
	if err := json.Unmarshal([]byte(q.output), &want); err != nil {
		t.Fatalf("README's quick start output %q: %v", q.output, err)
	}
	for _, k := range []string{"id", "created_at"} {
		if _, ok := got[k]; !ok {
			t.Errorf("the relay's line has no %s: %s", k, line)
		}
		delete(got, k)
		delete(want, k)
	}
	if g, w := fmt.Sprint(got), fmt.Sprint(want); g != w {
		t.Errorf("the relay printed %s\nthe README shows %s", line, q.output)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay run exited %d:\n%s", code, p.output())
	}
}

// TestREADMEWakeUpChannel: the channel the README names for each table,
// herald.<schema>.<table>, is the one the relay listens on.
func TestREADMEWakeUpChannel(t *testing.T) {
	t.Parallel()
	text := readme(t)
	for _, c := range []struct {
		tables migrations.Tables
		want   string
	}{
		{migrations.Tables{}.WithDefaults(), "herald.public.outbox"},
		{migrations.Tables{Schema: "shop", Table: "events"}.WithDefaults(), "herald.shop.events"},
	} {
		if got := c.tables.Channel(); got != c.want {
			t.Errorf("Channel() of %s.%s = %s, the README's rule gives %s", c.tables.Schema, c.tables.Table, got, c.want)
		}
	}
	for _, s := range []string{"`herald.<schema>.<table>`", "`herald.public.outbox`", "SELECT pg_notify('herald.public.outbox', '')"} {
		if !strings.Contains(text, s) {
			t.Errorf("README: the wake-up paragraph no longer says %s", s)
		}
	}
}
