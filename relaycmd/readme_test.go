package relaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/migrations"
)

// readmePath is the README the tests below keep true.
const readmePath = "../README.md"

// docsDir holds the pages the README links to, whose commands and
// examples the tests below keep true too.
const docsDir = "../docs"

func readme(t *testing.T) string {
	t.Helper()
	return readFile(t, readmePath)
}

// doc returns the text of docs/name.
func doc(t *testing.T, name string) string {
	t.Helper()
	return readFile(t, filepath.Join(docsDir, name))
}

// commandPages are the README and the pages its reference sections moved
// to: every relay command they show is run, or skipped with a reason, by
// TestREADMECommands.
var commandPages = []string{readmePath, "../CHANGELOG.md",
	docsDir + "/configuration.md", docsDir + "/operations.md", docsDir + "/mysql.md", docsDir + "/sinks.md",
	docsDir + "/reliability.md", docsDir + "/performance.md", docsDir + "/library.md", docsDir + "/demo.md",
	docsDir + "/testing.md", docsDir + "/comparison.md"}

// fencedBlock matches a fenced code block (possibly indented in a list):
// its language and its text.
var fencedBlock = regexp.MustCompile("(?ms)^[ \\t]*```(\\w*)\\n(.*?)^[ \\t]*```")

// relayInvocation matches a command line that runs the relay binary (or
// go run of it), however it is wrapped (docker compose exec relay ...).
var relayInvocation = regexp.MustCompile(`(?:^|\s)(?:relay|go run \./cmd/relay)\s+(?:migrate|run|status|dlq|queue|config|bench|demo|version)\b`)

// readmeRelayCommands returns, in README order and once each, every relay
// command the README shows: the lines of ```sh blocks that run the relay
// (without a trailing comment), and the inline code spans that start with
// one ("relay dlq show <id>"), whitespace normalised. The CLI synopsis, a
// block without a language, is not a command.
func readmeRelayCommands(text string) []string {
	var out []string
	add := func(c string) {
		c = strings.Join(strings.Fields(c), " ")
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	comment := regexp.MustCompile(`\s+#\s.*$`)
	type span struct {
		at  int
		cmd string
	}
	var found []span
	for _, m := range fencedBlock.FindAllStringSubmatchIndex(text, -1) {
		if text[m[2]:m[3]] != "sh" {
			continue
		}
		for _, line := range strings.Split(text[m[4]:m[5]], "\n") {
			line = comment.ReplaceAllString(strings.TrimSpace(line), "")
			if relayInvocation.MatchString(line) {
				found = append(found, span{m[4], line})
			}
		}
	}
	// Inline code spans, outside fenced blocks (blanked out, keeping
	// offsets); a span may wrap onto the next line.
	prose := []byte(text)
	for _, m := range fencedBlock.FindAllStringIndex(text, -1) {
		for i := m[0]; i < m[1]; i++ {
			if prose[i] != '\n' {
				prose[i] = ' '
			}
		}
	}
	startsWithRelay := regexp.MustCompile(`^(?:relay|go run \./cmd/relay)\s+(?:migrate|run|status|dlq|queue|config|bench|demo|version)\b`)
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllSubmatchIndex(prose, -1) {
		c := strings.Join(strings.Fields(string(prose[m[2]:m[3]])), " ")
		if startsWithRelay.MatchString(c) {
			found = append(found, span{m[2], c})
		}
	}
	slices.SortStableFunc(found, func(a, b span) int { return a.at - b.at })
	for _, f := range found {
		add(f.cmd)
	}
	return out
}

// readmeRun says what TestREADMECommands does with one README command.
type readmeRun struct {
	// skip is why the command is not run here; empty means it is run.
	skip string
	// line is the shell line run, when it differs from the README's
	// (a placeholder filled in, an optional flag chosen).
	line string
	// codes are the accepted exit statuses; none means 0.
	codes []int
	// want are substrings of stdout and stderr together.
	want []string
	// env is added to the environment.
	env []string
}

// skippedPrefixes are README commands not run here, by prefix, with why.
var skippedPrefixes = map[string]string{
	"go run ./cmd/relay bench": "benchmarks run for minutes; the bench tests run short ones",
	"relay bench":              "benchmarks run for minutes; the bench tests run short ones",
}

// readmeRuns classifies the README's relay commands, exactly as written
// there. A command the README gains must be added here, run or skipped
// with a reason; one it loses must be removed.
func readmeRuns(id string) map[string]readmeRun {
	const runs = "runs until SIGTERM; TestRunDeliversAndStopsGracefully and the run tests start it"
	return map[string]readmeRun{
		"relay migrate up":                    {want: []string{"nothing to apply"}},
		"relay run --config relay.yaml":       {skip: runs},
		"relay run":                           {skip: runs},
		"relay run --config herald.yaml":      {skip: "the README's quick start: TestREADMEQuickStart runs it"},
		"relay run --config relay-mysql.yaml": {skip: "the MySQL quick start: TestREADMEMySQL runs it on MariaDB"},
		"relay dlq list":                      {skip: "the MySQL quick start: TestREADMEMySQL runs it on MariaDB"},
		"relay status":                        {want: []string{"1 dead", "DELIVERED 1M"}},
		"relay status --config relay.yaml [--json]": {line: "relay status --config relay.yaml --json",
			want: []string{`"sink": "billing"`, `"dead": 1`}},
		"relay dlq list --config relay.yaml --topic 'orders.*' --since 24h":    {want: []string{id, "billing", "endpoint answered 410 Gone"}},
		"relay dlq list --config relay.yaml --sink billing --error '410 Gone'": {want: []string{id, "endpoint answered 410 Gone"}},
		"relay dlq show <id>":                         {line: "relay dlq show " + id, want: []string{"id:            " + id, "endpoint answered 410 Gone"}},
		"relay dlq replay --sink billing --dry-run":   {want: []string{id, "dry run: would replay 1 dead letter into"}},
		"relay dlq purge --older-than 720h --dry-run": {want: []string{"dry run: would purge 0 dead letters"}},
		// The example's Kafka and SMTP servers do not run here (exit 1
		// naming them), nor its RabbitMQ exchange; NATS, Mosquitto and
		// Redis do.
		"relay config check --config relay.yaml": {codes: []int{0, 1}, env: []string{"BILLING_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "RABBITMQ_URL=amqp://guest:guest@localhost:5672/"},
			want: []string{"config relay.yaml: valid", "is migrated", "sink bus (nats): ok", "sink events-kafka (kafka): ", "sink mail (email): ",
				"sink devices (mqtt): ok", "sink streams (redis): ok", "sink rabbit (rabbitmq): ",
				"sink billing (webhook): not checked", "orders.* -> events-kafka (kafka: the event's topic), bus (nats: events.{{.Topic}}), billing (webhook)"}},
		"relay migrate down": {want: []string{fmt.Sprintf("reverted %03d_", migrations.Latest())}},
		"relay version":      {want: []string{"relay "}},
		"relay queue drop --sink billing-v1 --dry-run": {want: []string{"dry run: would drop 0 deliveries of sink billing-v1"}},
		"relay queue drop --sink NAME":                 {skip: "TestQueueDrop drops a sink's queue and checks what it leaves"},
	}
}

// TestREADMECommands runs every relay command of the README and of the
// docs pages it links to (commandPages) that can run here, as written,
// against a schema of its own (the test adds --schema, and
// DATABASE_URL), in a directory holding the configuration example of
// docs/configuration.md as relay.yaml. Before, a relay delivers the
// README's INSERT example to a webhook answering 410 Gone, so the
// dead-letter commands work on a dead letter as a relay stores it. A
// command that is neither run nor skipped with a reason fails the test.
func TestREADMECommands(t *testing.T) {
	t.Parallel()
	natstest.URL(t) // the example's NATS sink
	text := readme(t)
	var commands []string
	for _, page := range commandPages {
		for _, c := range readmeRelayCommands(readFile(t, page)) {
			if !slices.Contains(commands, c) {
				commands = append(commands, c)
			}
		}
	}
	// Reverting a migration comes last: the commands before it need the
	// schema at its latest version.
	slices.SortStableFunc(commands, func(a, b string) int {
		return boolCmp(strings.HasPrefix(a, "relay migrate down"), strings.HasPrefix(b, "relay migrate down"))
	})
	url, password := dbURL(t)
	pool := pgtest.Pool(t)
	s := schema(t)
	ctx := context.Background()

	// A dead letter as a relay leaves it.
	if r := runRelay(t, nil, "migrate", "up", "--database-url", url, "--schema", s); r.code != 0 {
		t.Fatalf("migrate up:\n%s", r)
	}
	gone := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusGone)
	}))
	defer gone.Close()
	insert := readmeInsert(t, text)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET search_path TO "+s); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, insert); err != nil {
		t.Fatalf("README's INSERT example: %v", err)
	}
	if _, err := conn.Exec(ctx, "RESET search_path"); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	seed := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {poll_interval: 100ms, shutdown_timeout: 5s}
sinks: [{name: billing, type: webhook, url: %q}]
routes: [{topics: ["orders.*"], sinks: [billing]}]
`, url, s, gone.URL))
	p := start(t, nil, "run", "--config", seed)
	tables := migrations.Tables{Schema: s}.WithDefaults()
	var id string
	deadline := time.Now().Add(time.Minute)
	for {
		err := pool.QueryRow(ctx, "SELECT id::text FROM "+tables.Deliveries()+" WHERE state = 'dead'").Scan(&id)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead letter within a minute (%v):\n%s", err, p.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("seeding relay exit %d:\n%s", code, p.output())
	}

	// The directory the commands run in: the README's configuration
	// example as relay.yaml, with the email templates it names.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "relay.yaml"), []byte(configExample(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "templates"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "templates", "order_paid.txt"), []byte("Order {{.order_id}} is paid.\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	runs := readmeRuns(id)
	seen := map[string]bool{}
	for _, c := range commands {
		run, ok := runs[c]
		seen[c] = ok
		if !ok {
			for prefix, why := range skippedPrefixes {
				if strings.HasPrefix(c, prefix) {
					run, ok = readmeRun{skip: why}, true
				}
			}
		}
		if !ok {
			t.Errorf("command %q (README or docs) is neither run nor skipped with a reason: add it to readmeRuns", c)
			continue
		}
		if run.skip != "" {
			t.Logf("not run: %s (%s)", c, run.skip)
			continue
		}
		line := c
		if run.line != "" {
			line = run.line
		}
		r := runShell(t, dir, append(run.env, "DATABASE_URL="+url), line+" --schema "+s)
		codes := run.codes
		if len(codes) == 0 {
			codes = []int{0}
		}
		if !slices.Contains(codes, r.code) {
			t.Errorf("README command %q: exit %d, want %v:\n%s", line, r.code, codes, r)
			continue
		}
		for _, w := range run.want {
			if !strings.Contains(r.stdout+r.stderr, w) {
				t.Errorf("README command %q: output lacks %q:\n%s", line, w, r)
			}
		}
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Errorf("README command %q printed the database password:\n%s", line, r)
		}
	}
	for c := range runs {
		if !seen[c] {
			t.Errorf("readmeRuns lists %q, which neither the README nor the docs show any more: remove it", c)
		}
	}
}

// boolCmp orders false before true.
func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// runShell runs line with sh in dir, the relay binary first on PATH.
func runShell(t *testing.T, dir string, env []string, line string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir = dir
	cmd.Env = append(environ(env...), "PATH="+filepath.Dir(relayBin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %q: %v", line, err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// readmeInsert is the README's SQL example: the quick start's
// transaction writing one event.
func readmeInsert(t *testing.T, text string) string {
	t.Helper()
	for _, m := range fencedBlock.FindAllStringSubmatch(text, -1) {
		if m[1] == "sql" {
			if !strings.Contains(m[2], "INSERT INTO outbox") {
				t.Fatalf("README: the first SQL example writes no event:\n%s", m[2])
			}
			return m[2]
		}
	}
	t.Fatal("README: no SQL example")
	return ""
}

// configExample is the relay.yaml example of docs/configuration.md: the
// first YAML block with routes.
func configExample(t *testing.T) string {
	t.Helper()
	for _, m := range fencedBlock.FindAllStringSubmatch(doc(t, "configuration.md"), -1) {
		if m[1] == "yaml" && strings.Contains(m[2], "\nroutes:") {
			return m[2]
		}
	}
	t.Fatal("docs/configuration.md: no YAML configuration example with routes")
	return ""
}

// TestREADMEConfigExample: the configuration example of
// docs/configuration.md loads as written (its secrets set), and every
// relay setting it shows is the default the key table states, so that
// copying the example changes nothing by surprise.
func TestREADMEConfigExample(t *testing.T) {
	t.Parallel()
	text := doc(t, "configuration.md")
	example := configExample(t)
	env := map[string]string{"BILLING_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "RABBITMQ_URL": "amqp://guest:guest@localhost:5672/"}
	if _, err := relayconfig.Parse("README example", []byte(example), func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatalf("docs/configuration.md's example does not load: %v", err)
	}
	var parsed struct {
		Relay map[string]any `yaml:"relay"`
	}
	if err := yaml.Unmarshal([]byte(example), &parsed); err != nil {
		t.Fatal(err)
	}
	if len(parsed.Relay) == 0 {
		t.Fatal("the example has no relay section")
	}
	for key, v := range parsed.Relay {
		if _, nested := v.(map[string]any); nested {
			continue // backoff: {initial, max} is one row with several defaults
		}
		row := regexp.MustCompile("(?m)^\\| `relay\\." + regexp.QuoteMeta(key) + "` \\| ([^|]*) \\|").FindStringSubmatch(text)
		if row == nil {
			t.Errorf("relay.%s: shown in the example, missing from the key table", key)
			continue
		}
		if got, want := fmt.Sprint(v), strings.TrimSpace(row[1]); got != want {
			t.Errorf("relay.%s: the example says %s, the key table's default is %s", key, got, want)
		}
	}
}

// TestREADMEGoSnippetCompiles builds the README's Go library example as
// pasted into a file of its own (imports added), inside this module.
func TestREADMEGoSnippetCompiles(t *testing.T) {
	t.Parallel()
	var snippet string
	for _, m := range fencedBlock.FindAllStringSubmatch(readme(t), -1) {
		if m[1] == "go" {
			snippet = m[2]
			break
		}
	}
	if snippet == "" {
		t.Fatal("README: no Go example")
	}
	src := `package readmesnippet

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/outbox"
)

` + snippet
	// The file joins the module through an overlay: nothing is written
	// into the source tree.
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "snippet.go")
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	overlay, _ := json.Marshal(map[string]any{"Replace": map[string]string{filepath.Join(root, "internal", "readmesnippet", "snippet.go"): file}})
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-trimpath", "-overlay", overlayFile, "./internal/readmesnippet")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's Go example does not compile: %v\n%s\nsource:\n%s", err, out, src)
	}
}
