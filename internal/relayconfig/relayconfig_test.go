package relayconfig_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// valid is a configuration with one sink of each type; cases edit it.
const valid = `# Herald test configuration
database:
  url: postgres://postgres@127.0.0.1:5432/test?sslmode=disable
  schema: public
  table: outbox
  max_conns: 12
relay:
  batch_size: 250
  max_batch_bytes: 32MiB
  max_event_bytes: 1048576
  lease: 20s
  poll_interval: 500ms
  poll_only: true
  max_attempts: 7
  backoff: {initial: 2s, max: 5m, multiplier: 3, jitter: 0}
  sink_pause: {initial: 1s, max: 1m}
  publish_timeout: 5s
  hand_off_after: 80ms
  max_in_flight: 600
  retention: 1h
  stop_key_on_dead_letter: true
  shutdown_timeout: 10s
log: {level: debug, format: json}
sinks:
  - name: console
    type: stdout
  - name: events-kafka
    type: kafka
    brokers: [127.0.0.1:9092]
  - name: bus
    type: nats
    url: nats://127.0.0.1:4222
  - name: hook
    type: webhook
    url: http://127.0.0.1:9/hook
  - name: mail
    type: email
    smtp: {host: 127.0.0.1, port: 2525}
    from: shop@example.com
    templates_dir: testdata/templates
    template: welcome
    subject: Welcome
  - name: void
    type: discard
routes:
  - topics: ["orders.*", "payments.*"]
    sinks: [events-kafka, {name: bus, destination: "events.{{.Topic}}"}]
  - topics: ["users.created"]
    sinks: [hook, mail]
  - topics: ["*"]
    sinks: [console, void]
`

func noEnv(string) (string, bool) { return "", false }

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// edit returns valid with old replaced by new, failing if old is absent.
func edit(t *testing.T, pairs ...string) string {
	t.Helper()
	out := valid
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(out, pairs[i]) {
			t.Fatalf("test setup: %q not in the valid config", pairs[i])
		}
		out = strings.Replace(out, pairs[i], pairs[i+1], 1)
	}
	return out
}

func TestParseValid(t *testing.T) {
	t.Parallel()
	f, err := relayconfig.Parse("valid.yaml", []byte(valid), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.DatabaseURL(); got != "postgres://postgres@127.0.0.1:5432/test?sslmode=disable" {
		t.Errorf("DatabaseURL() = %q", got)
	}
	if tb := f.Tables(); tb.Schema != "public" || tb.Table != "outbox" {
		t.Errorf("Tables() = %+v", tb)
	}
	if n := f.MaxConns(); n != 12 {
		t.Errorf("MaxConns() = %d, want database.max_conns 12", n)
	}
	if f.Log.Level != "debug" || f.Log.Format != "json" {
		t.Errorf("Log = %+v", f.Log)
	}
	r := f.Relay
	if r.BatchSize != 250 || r.Lease != 20*time.Second || r.PollInterval != 500*time.Millisecond || !r.PollOnly ||
		r.MaxAttempts != 7 || r.PublishTimeout != 5*time.Second || r.Retention != time.Hour ||
		!r.StopKeyOnDeadLetter || r.ShutdownTimeout != 10*time.Second || r.Backoff.Multiplier != 3 ||
		r.MaxBatchBytes != 32<<20 || r.MaxEventBytes != 1<<20 || r.HandOffAfter != 80*time.Millisecond || r.MaxInFlight != 600 {
		t.Errorf("Relay = %+v", r)
	}
	if got := strings.Join(f.SinkNames(), ","); got != "console,events-kafka,bus,hook,mail,void" {
		t.Errorf("SinkNames() = %s", got)
	}
}

func TestParseDefaults(t *testing.T) {
	t.Parallel()
	f, err := relayconfig.Parse("min.yaml", []byte(`
database: {url: "host=127.0.0.1 user=postgres dbname=test"}
sinks: [{name: console, type: stdout}]
routes: [{topics: ["*"], sinks: [console]}]
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if tb := f.Tables(); tb.Schema != "public" || tb.Table != "outbox" {
		t.Errorf("Tables() = %+v, want public.outbox", tb)
	}
	if n := f.MaxConns(); n != relay.PoolSize(2) {
		t.Errorf("MaxConns() = %d, want %d for the default two workers", n, relay.PoolSize(2))
	}
	if f.Log.Level != "info" || f.Log.Format != "text" {
		t.Errorf("Log = %+v, want info/text", f.Log)
	}
	b, err := f.Build(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	c := b.Config.WithDefaults()
	if c.BatchSize != 1000 || c.Lease != 30*time.Second || c.Backoff.Jitter != 0.2 || c.Backoff.Max != 10*time.Minute {
		t.Errorf("defaults not applied: %+v", c)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		yaml string
		env  map[string]string
		want []string // substrings of the error
	}{
		{"unknown relay key", edit(t, "batch_size: 250", "bach_size: 250"), nil, []string{"relay.bach_size: unknown key; did you mean relay.batch_size? (line 8)"}},
		{"misspelt relay key", edit(t, "max_attempts: 7", "max_attemps: 7"), nil, []string{"relay.max_attemps: unknown key; did you mean relay.max_attempts?"}},
		{"unknown top-level key", edit(t, "database:", "databse:"), nil, []string{"databse: unknown key; did you mean database?"}},
		{"unknown nested key", edit(t, "sink_pause: {initial: 1s", "sink_pause: {inital: 1s"), nil, []string{"relay.sink_pause.inital: unknown key; did you mean relay.sink_pause.initial?"}},
		{"key in another case and with dashes", edit(t, "max_attempts: 7", "Max-Attempts: 7"), nil, []string{"relay.Max-Attempts: unknown key; did you mean relay.max_attempts?"}},
		{"duplicate key", edit(t, "lease: 20s", "lease: 20s\n  lease: 10s"), nil, []string{"relay.lease: duplicate key"}},
		{"bad duration", edit(t, "lease: 20s", "lease: 30 sec"), nil, []string{`relay.lease: invalid duration "30 sec"`}},
		{"bare number duration", edit(t, "poll_interval: 500ms", "poll_interval: 500"), nil, []string{`relay.poll_interval: invalid duration "500"`}},
		{"duration as list", edit(t, "retention: 1h", "retention: [1h]"), nil, []string{"relay.retention: expected a duration"}},
		{"not an integer", edit(t, "batch_size: 250", "batch_size: lots"), nil, []string{`relay.batch_size: expected an integer, got "lots"`}},
		{"not a bool", edit(t, "poll_only: true", "poll_only: maybe"), nil, []string{`relay.poll_only: expected true or false`}},
		{"section not a mapping", edit(t, "log: {level: debug, format: json}", "log: debug"), nil, []string{`log: expected a mapping`}},
		{"bad size", edit(t, "max_batch_bytes: 32MiB", "max_batch_bytes: lots"), nil, []string{`relay.max_batch_bytes: invalid size "lots"`}},
		{"size as list", edit(t, "max_batch_bytes: 32MiB", "max_batch_bytes: [1]"), nil, []string{"relay.max_batch_bytes: expected a size"}},
		{"event size over a GiB", edit(t, "max_event_bytes: 1048576", "max_event_bytes: 2GiB"), nil, []string{"relay.max_event_bytes: must be between 1 and 1073741824"}},
		{"batch size out of range", edit(t, "batch_size: 250", "batch_size: 20000"), nil, []string{"relay.batch_size: must be between 1 and 10000"}},
		{"publish timeout over lease", edit(t, "publish_timeout: 5s", "publish_timeout: 25s"), nil, []string{"relay.publish_timeout"}},
		{"publish timeout over half the lease", edit(t, "publish_timeout: 5s", "publish_timeout: 11s"), nil, []string{"relay.publish_timeout: must be positive and at most half of relay.lease (10s)"}},
		{"hand-off past the publish timeout", edit(t, "hand_off_after: 80ms", "hand_off_after: 6s"), nil, []string{"relay.hand_off_after: must be positive and at most relay.publish_timeout (5s)"}},
		{"no event in flight", edit(t, "max_in_flight: 600", "max_in_flight: -1"), nil, []string{"relay.max_in_flight: must be at least 1"}},
		{"max conns negative", edit(t, "max_conns: 12", "max_conns: -1"), nil, []string{"database.max_conns: must be between 1 and 1000"}},
		{"backoff max below initial", edit(t, "backoff: {initial: 2s, max: 5m", "backoff: {initial: 2s, max: 1s"), nil, []string{"relay.backoff.max"}},
		{"jitter out of range", edit(t, "jitter: 0}", "jitter: 1.5}"), nil, []string{"relay.backoff.jitter"}},
		{"negative retention", edit(t, "retention: 1h", "retention: -1h"), nil, []string{"relay.retention"}},
		{"log level", edit(t, "level: debug", "level: loud"), nil, []string{`log.level: unknown level "loud"`}},
		{"log format", edit(t, "format: json", "format: xml"), nil, []string{`log.format: unknown format "xml"`}},
		{"database url missing", edit(t, "  url: postgres://postgres@127.0.0.1:5432/test?sslmode=disable\n", ""), nil, []string{"database.url: required"}},
		{"database url scheme", edit(t, "url: postgres://postgres@", "url: sqlserver://postgres@"), nil, []string{`database.url: scheme "sqlserver"`}},
		{"database url unparsable", edit(t, "url: postgres://postgres@", "url: postgres://postgres:p%zz@"), nil, []string{"database.url: not a valid URL"}},
		{"database url bad parameter", edit(t, "sslmode=disable", "sslmode=sometimes"), nil, []string{"database.url:"}},
		{"database url bad key=value", edit(t, "url: postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "url: host=127.0.0.1 port=http"), nil, []string{"database.url:"}},
		{"table with quote", edit(t, "table: outbox", `table: 'out"box'`), nil, []string{"database.table"}},
		{"table with semicolon", edit(t, "table: outbox", `table: "outbox; DROP TABLE x"`), nil, []string{"database.table"}},
		{"schema with semicolon", edit(t, "schema: public", `schema: "a;b"`), nil, []string{"database.schema"}},
		{"no sinks", "database: {url: postgres://x@h/d}\nroutes: [{topics: ['*'], sinks: [a]}]\n", nil, []string{"sinks: at least one sink is required"}},
		{"sinks not a list", "database: {url: postgres://x@h/d}\nsinks: {name: a}\n", nil, []string{"sinks: expected a list"}},
		{"sink not a mapping", edit(t, "  - name: void\n    type: discard\n", "  - void\n"), nil, []string{"sinks[5]: expected a mapping"}},
		{"sink name missing", edit(t, "  - name: void\n", "  - \n"), nil, []string{"sinks[5].name: required"}},
		{"sink name invalid", edit(t, "name: void", "name: Void Sink"), nil, []string{`sinks[5].name: "Void Sink" must be`}},
		{"sink name duplicate", edit(t, "name: void", "name: console"), nil, []string{`sinks[5].name: "console" is already the name of sinks[0]`}},
		{"sink type missing", edit(t, "    type: discard\n", ""), nil, []string{"sinks[5].type: required"}},
		{"sink type unknown", edit(t, "type: nats", "type: kafak"), nil, []string{`sinks[2].type: unknown sink type "kafak" (known: discard, email, kafka, mqtt, nats, pubsub, rabbitmq, redis, sns, sqs, stdout, webhook)`}},
		{"sink key unknown", edit(t, "type: stdout", "type: stdout\n    brokers: [x:1]"), nil, []string{"sinks[0] (console).brokers: unknown key (line"}},
		{"kafka without brokers", edit(t, "brokers: [127.0.0.1:9092]", "brokers: []"), nil, []string{"sinks[1] (events-kafka).brokers: must list at least one broker"}},
		{"kafka brokers wrong shape", edit(t, "brokers: [127.0.0.1:9092]", "brokers: {a: b}"), nil, []string{"sinks[1] (events-kafka).brokers: expected a list"}},
		{"kafka joined errors", edit(t, "brokers: [127.0.0.1:9092]", "brokers: []\n    compression: rar"), nil, []string{"sinks[1] (events-kafka).brokers:", "sinks[1] (events-kafka).compression:"}},
		{"kafka nested unknown key", edit(t, "brokers: [127.0.0.1:9092]", "brokers: [127.0.0.1:9092]\n    tls: {enabeld: true}"), nil, []string{"sinks[1] (events-kafka).tls.enabeld: unknown key"}},
		{"nats bad url", edit(t, "url: nats://127.0.0.1:4222", "url: http://127.0.0.1:4222"), nil, []string{"sinks[2] (bus).url:"}},
		{"webhook bad url", edit(t, "url: http://127.0.0.1:9/hook", "url: ftp://127.0.0.1/x"), nil, []string{"sinks[3] (hook).url:"}},
		{"webhook bad timeout", edit(t, "url: http://127.0.0.1:9/hook", "url: http://127.0.0.1:9/hook\n    timeout: soon"), nil, []string{`sinks[3] (hook).timeout: invalid duration "soon"`}},
		{"email missing host", edit(t, "smtp: {host: 127.0.0.1, port: 2525}", "smtp: {port: 2525}"), nil, []string{"sinks[4] (mail).smtp.host"}},
		{"no routes", edit(t, valid[strings.Index(valid, "routes:"):], ""), nil, []string{"routes: at least one route is required"}},
		{"route unknown sink", edit(t, "sinks: [hook, mail]", "sinks: [hook, mial]"), nil, []string{`routes[1].sinks[1]: unknown sink "mial"`}},
		{"route unknown sink in mapping", edit(t, "{name: bus,", "{name: bsu,"), nil, []string{`routes[0].sinks[1]: unknown sink "bsu"`}},
		{"route target wrong shape", edit(t, "sinks: [hook, mail]", "sinks: [[hook], mail]"), nil, []string{"routes[1].sinks[0]: expected a sink name or {name, destination}"}},
		{"route target unknown key", edit(t, "destination: ", "dest: "), nil, []string{"routes[0].sinks[1].dest: unknown key"}},
		{"route target without name", edit(t, "{name: bus, destination", "{destination"), nil, []string{"routes[0].sinks[1]: sink name required"}},
		{"destination does not parse", edit(t, `"events.{{.Topic}}"`, `"events.{{.Topic"`), nil, []string{"routes[0].sinks[1] (bus).destination: invalid template"}},
		{"destination misspelt field", edit(t, `"events.{{.Topic}}"`, `"events.{{.Topik}}"`), nil, []string{"routes[0].sinks[1] (bus).destination: invalid template", "Topik"}},
		{"destination unknown function", edit(t, `"events.{{.Topic}}"`, `"{{upper .Topic}}"`), nil, []string{"routes[0].sinks[1] (bus).destination: invalid template"}},
		{"route without topics", edit(t, `topics: ["users.created"]`, `topics: []`), nil, []string{"routes[1].topics: must list at least one topic pattern"}},
		{"route unknown key", edit(t, `topics: ["users.created"]`, `topic: ["users.created"]`), nil, []string{"routes[1].topic: unknown key; did you mean routes[1].topics?"}},
		{"sink twice in a route", edit(t, "sinks: [hook, mail]", "sinks: [hook, hook]"), nil, []string{`routes[1].sinks[1]: sink "hook" listed twice`}},
		{"alias", edit(t, "  - topics: [\"*\"]\n    sinks: [console, void]", "  - topics: &all [\"*\"]\n    sinks: [console, void]\n  - topics: *all\n    sinks: [hook]"), nil, []string{"routes[3].topics: YAML aliases"}},
		{"missing variable", edit(t, "postgres://postgres@", "postgres://postgres:${DB_PASSWORD}@"), nil, []string{"database.url: environment variable DB_PASSWORD is not set", "line 3"}},
		{"missing variable in a sink", edit(t, "brokers: [127.0.0.1:9092]", "brokers: [\"${KAFKA_HOST}:9092\"]"), nil, []string{"sinks[1].brokers[0]: environment variable KAFKA_HOST is not set"}},
		{"bad variable name", edit(t, "name: void", "name: ${1X}"), nil, []string{`sinks[5].name: "1X" is not a valid environment variable name`}},
		{"unterminated reference", edit(t, "name: void", "name: ${VOID"), nil, []string{"sinks[5].name: unterminated ${"}},
		{"quoted variable into an integer", edit(t, "batch_size: 250", `batch_size: "${BATCH}"`), map[string]string{"BATCH": "250"}, []string{`relay.batch_size: expected an integer, got "${BATCH}" (from the environment, value not shown)`}},
		{"invalid YAML", "database: {url: x\nrelay: [", nil, []string{"invalid YAML"}},
		{"empty", "", nil, []string{"the file is empty"}},
		{"two documents", valid + "---\nrelay: {}\n", nil, []string{"exactly one YAML document"}},
		{"top-level list", "- a\n- b\n", nil, []string{"must be a YAML mapping"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := relayconfig.Parse("relay.yaml", []byte(c.yaml), envOf(c.env))
			if err == nil {
				t.Fatalf("Parse succeeded, want an error containing %q", c.want)
			}
			if !strings.HasPrefix(err.Error(), "config relay.yaml: ") {
				t.Errorf("error %q does not name the file", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(path, []byte(valid), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := relayconfig.Load(path, noEnv); err != nil {
		t.Fatalf("Load(valid) = %v", err)
	}
	_, err := relayconfig.Load(filepath.Join(dir, "missing.yaml"), noEnv)
	if err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("Load(missing) = %v, want an error naming the file", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(edit(t, "lease: 20s", "lease: 30 sec")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = relayconfig.Load(bad, noEnv)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), `relay.lease: invalid duration "30 sec"`) {
		t.Fatalf("Load(bad) = %v", err)
	}
	huge := filepath.Join(dir, "huge.yaml")
	if err := os.WriteFile(huge, bytes.Repeat([]byte("# padding\n"), 500_000), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := relayconfig.Load(huge, noEnv); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("Load(huge) = %v, want a size error", err)
	}
}

func TestLoadUsesProcessEnvironmentByDefault(t *testing.T) {
	t.Setenv("HERALD_TEST_OWNER", "owner-from-env")
	t.Setenv("DATABASE_URL", "")
	f, err := relayconfig.Parse("relay.yaml", []byte(edit(t, "batch_size: 250", "owner: ${HERALD_TEST_OWNER}")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Relay.Owner != "owner-from-env" {
		t.Fatalf("Owner = %q, want the value of HERALD_TEST_OWNER", f.Relay.Owner)
	}
}

func TestEnvExpansion(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{
		"BATCH":     "125",
		"POLL_ONLY": "false",
		"EMPTY":     "",
		"OWNER":     "relay-a",
		"NESTED":    "${OWNER}",
		"INJECT":    "x\nbatch_size: 7\nlease: 1h",
		"KAFKA":     "10.0.0.1:9092",
	})
	yaml := edit(t,
		"# Herald test configuration", "# Herald test configuration ${NOT_SET_BUT_IN_A_COMMENT}",
		"batch_size: 250", "batch_size: ${BATCH} # ${ALSO_IN_A_COMMENT}",
		"poll_only: true", "poll_only: ${POLL_ONLY}",
		"lease: 20s", "lease: ${LEASE:-25s}",
		"poll_interval: 500ms", "poll_interval: ${EMPTY:-750ms}",
		"retention: 1h", "retention: ${EMPTY}0s",
		"brokers: [127.0.0.1:9092]", "brokers: [\"${KAFKA}\"]",
		"schema: public", "schema: pre_${OWNER}_post",
	)
	cases := map[string]string{
		"nested":        "owner: ${NESTED}",
		"injection":     "owner: ${INJECT}",
		"escaped":       "owner: $${OWNER}",
		"dollar kept":   "owner: pa$word$",
		"default":       "owner: ${UNSET:-fallback}",
		"default brace": "owner: '${UNSET:-a}b'",
	}
	want := map[string]string{
		"nested":        "${OWNER}",
		"injection":     "x\nbatch_size: 7\nlease: 1h",
		"escaped":       "${OWNER}",
		"dollar kept":   "pa$word$",
		"default":       "fallback",
		"default brace": "ab",
	}
	for name, owner := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			y := strings.Replace(yaml, "relay:\n", "relay:\n  "+owner+"\n", 1)
			f, err := relayconfig.Parse("relay.yaml", []byte(y), env)
			if err != nil {
				t.Fatal(err)
			}
			r := f.Relay
			if r.Owner != want[name] {
				t.Errorf("owner = %q, want %q", r.Owner, want[name])
			}
			if r.BatchSize != 125 || r.PollOnly || r.Lease != 25*time.Second || r.PollInterval != 750*time.Millisecond || r.Retention != 0 {
				t.Errorf("expanded relay section = %+v", r)
			}
			if f.Tables().Schema != "pre_relay-a_post" {
				t.Errorf("schema = %q", f.Tables().Schema)
			}
		})
	}
}

func TestDatabaseURLFromEnvironment(t *testing.T) {
	t.Parallel()
	f, err := relayconfig.Parse("relay.yaml", []byte(valid), envOf(map[string]string{"DATABASE_URL": "postgres://app@db.internal/app"}))
	if err != nil {
		t.Fatal(err)
	}
	if f.DatabaseURL() != "postgres://app@db.internal/app" {
		t.Fatalf("DatabaseURL() = %q, want DATABASE_URL's value", f.DatabaseURL())
	}
	noURL := edit(t, "  url: postgres://postgres@127.0.0.1:5432/test?sslmode=disable\n", "")
	if _, err := relayconfig.Parse("relay.yaml", []byte(noURL), envOf(map[string]string{"DATABASE_URL": "postgres://app@db/app"})); err != nil {
		t.Fatalf("DATABASE_URL should stand in for a missing database.url: %v", err)
	}
	_, err = relayconfig.Parse("relay.yaml", []byte(valid), envOf(map[string]string{"DATABASE_URL": "sqlserver://app@db/app"}))
	if err == nil || !strings.Contains(err.Error(), "database.url") {
		t.Fatalf("bad DATABASE_URL: %v, want an error naming database.url", err)
	}
}

func TestBuildEverySinkType(t *testing.T) {
	t.Parallel()
	f, err := relayconfig.Parse("relay.yaml", []byte(valid), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	b, err := f.Build(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, s := range b.Sinks {
		types[s.Name()] = fmt.Sprintf("%T", s)
	}
	wantTypes := map[string]string{
		"console": "*sinks.Stdout", "events-kafka": "*kafka.Sink", "bus": "*nats.Sink",
		"hook": "*webhook.Sink", "mail": "*email.Sink", "void": "*sinks.Discard",
	}
	for name, typ := range wantTypes {
		if types[name] != typ {
			t.Errorf("sink %s is %q, want %s", name, types[name], typ)
		}
	}
	if len(b.Sinks) != len(wantTypes) {
		t.Errorf("built %d sinks, want %d", len(b.Sinks), len(wantTypes))
	}
	c := b.Config
	if err := c.WithDefaults().Validate(); err != nil {
		t.Errorf("built config does not validate: %v", err)
	}
	if c.BatchSize != 250 || c.Lease != 20*time.Second || c.PollInterval != 500*time.Millisecond || !c.PollOnly ||
		c.MaxAttempts != 7 || c.PublishTimeout != 5*time.Second || c.Retention != time.Hour || !c.StopKeyOnDeadLetter ||
		c.ShutdownTimeout != 10*time.Second || c.Tables.Outbox() != `"public"."outbox"` ||
		c.MaxBatchBytes != 32<<20 || c.MaxEventBytes != 1<<20 {
		t.Errorf("relay.Config = %+v", c)
	}
	if c.Backoff != (relay.Backoff{Initial: 2 * time.Second, Max: 5 * time.Minute, Multiplier: 3, Jitter: -1}) {
		t.Errorf("Backoff = %+v, want jitter: 0 to mean none (-1)", c.Backoff)
	}
	if c.SinkPause != (relay.Backoff{Initial: time.Second, Max: time.Minute}) {
		t.Errorf("SinkPause = %+v", c.SinkPause)
	}
	if len(c.Routes) != 3 {
		t.Fatalf("%d routes, want 3", len(c.Routes))
	}
	r0 := c.Routes[0]
	if strings.Join(r0.Topics, ",") != "orders.*,payments.*" || len(r0.Targets) != 2 ||
		r0.Targets[0].Sink.Name() != "events-kafka" || r0.Targets[0].Destination != nil || r0.Targets[1].Sink.Name() != "bus" {
		t.Fatalf("route 0 = %+v", r0)
	}
	var dest bytes.Buffer
	if err := r0.Targets[1].Destination.Execute(&dest, relay.DestinationData{Topic: "orders.created"}); err != nil || dest.String() != "events.orders.created" {
		t.Errorf("destination rendered %q, %v", dest.String(), err)
	}
	if err := r0.Targets[1].Destination.Execute(&dest, relay.DestinationData{Topic: "x"}); err != nil {
		t.Errorf("destination template: %v", err)
	}
	if strings.Contains(logs.String(), "used by no route") {
		t.Errorf("a sink was reported unused: %s", logs.String())
	}
	if err := b.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestBuildWarnsAboutUnusedSinks(t *testing.T) {
	t.Parallel()
	f, err := relayconfig.Parse("relay.yaml", []byte(edit(t, "sinks: [hook, mail]", "sinks: [hook]")), noEnv)
	if err != nil {
		t.Fatalf("an unused sink must not be an error: %v", err)
	}
	var logs bytes.Buffer
	b, err := f.Build(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "sink=mail") {
		t.Errorf("no warning about the unused sink mail in %q", logs.String())
	}
	for _, s := range b.Sinks {
		if s.Name() == "mail" {
			t.Errorf("the unused sink mail was created")
		}
	}
}

func TestBuildFailureNamesTheSink(t *testing.T) {
	t.Parallel()
	// templates_dir exists only when New reads it: Parse accepts the file.
	f, err := relayconfig.Parse("relay.yaml", []byte(edit(t, "templates_dir: testdata/templates", "templates_dir: testdata/no-such-dir")), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Build(context.Background(), slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "creating email sink mail") {
		t.Fatalf("Build = %v, want an error naming the email sink", err)
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	const (
		dbPassword    = "Db-Pa55word-XYZ"
		webhookSecret = "whsec_aGVyYWxkLXRlc3Qtc2lnbmluZy1rZXktMDEyMzQ1Njc4OQ=="
		natsPassword  = "nats-pa55-QRS"
	)
	base := edit(t,
		"url: postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "url: postgres://postgres:${DB_PASSWORD}@127.0.0.1:5432/test?sslmode=disable",
		"url: http://127.0.0.1:9/hook", "url: http://127.0.0.1:9/hook\n    secret: ${WEBHOOK_SECRET}\n    headers: {Authorization: \"Bearer ${WEBHOOK_SECRET}\"}",
		"url: nats://127.0.0.1:4222", "url: nats://127.0.0.1:4222\n    user: herald\n    password: ${NATS_PASSWORD}",
	)
	env := envOf(map[string]string{"DB_PASSWORD": dbPassword, "WEBHOOK_SECRET": webhookSecret, "NATS_PASSWORD": natsPassword})
	check := func(t *testing.T, what, text string) {
		t.Helper()
		for _, s := range []string{dbPassword, webhookSecret, natsPassword, "aGVyYWxkLXRlc3Qtc2lnbmluZy1rZXktMDEyMzQ1Njc4OQ"} {
			if strings.Contains(text, s) {
				t.Errorf("%s reveals a secret: %s", what, text)
			}
		}
	}
	variants := map[string][2]string{
		"bad sslmode":           {"sslmode=disable", "sslmode=sometimes"},
		"bad url param":         {"sslmode=disable", "sslmode=disable&connect_timeout=soon"},
		"bad url escape":        {"${DB_PASSWORD}@", "${DB_PASSWORD}%zz@"},
		"bad url scheme":        {"url: postgres://postgres:", "url: sqlserver://postgres:"},
		"webhook unknown key":   {"    secret: ${WEBHOOK_SECRET}", "    secret: ${WEBHOOK_SECRET}\n    retries: 3"},
		"webhook secret wrong":  {"secret: ${WEBHOOK_SECRET}", "secret: x${WEBHOOK_SECRET}"},
		"webhook header type":   {"headers: {Authorization: \"Bearer ${WEBHOOK_SECRET}\"}", "headers: {Authorization: [\"${WEBHOOK_SECRET}\"]}"},
		"nats password as int":  {"password: ${NATS_PASSWORD}", "password: ${NATS_PASSWORD}\n    max_pending: ${NATS_PASSWORD}"},
		"password as duration":  {"password: ${NATS_PASSWORD}", "password: ${NATS_PASSWORD}\n    ack_timeout: ${NATS_PASSWORD}"},
		"password as sink type": {"type: nats", "type: nats${NATS_PASSWORD}"},
		"password as list":      {"brokers: [127.0.0.1:9092]", "brokers: ${NATS_PASSWORD}"},
		"route error":           {"sinks: [hook, mail]", "sinks: [hook, mial]"},
		"relay error":           {"lease: 20s", "lease: 30 sec"},
	}
	for name, v := range variants {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			y := strings.Replace(base, v[0], v[1], 1)
			if y == base {
				t.Fatalf("test setup: %q not found", v[0])
			}
			_, err := relayconfig.Parse("relay.yaml", []byte(y), env)
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			check(t, "error", err.Error())
		})
	}
	t.Run("valid file, build and logs", func(t *testing.T) {
		t.Parallel()
		f, err := relayconfig.Parse("relay.yaml", []byte(strings.Replace(base, "sinks: [hook, mail]", "sinks: [mail]", 1)), env)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(f.DatabaseURL(), dbPassword) {
			t.Fatal("DatabaseURL() must return the real password for connecting")
		}
		check(t, "RedactURL", relayconfig.RedactURL(f.DatabaseURL()))
		check(t, "%+v of the file", fmt.Sprintf("%+v %#v", *f, f.Database))
		var logs bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		b, err := f.Build(context.Background(), logger)
		if err != nil {
			t.Fatal(err)
		}
		logger.Info("database", "url", f.Database.URL, "config", f.Database)
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs.String(), "sink is used by no route") {
			t.Errorf("expected the unused-sink warning in the logs: %s", logs.String())
		}
		check(t, "logs", logs.String())
	})
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"postgres://u:secret@h:5432/db?sslmode=disable": "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"postgres://u@h/db":                             "postgres://u@h/db",
		"postgres://h/db?user=u&password=secret":        "postgres://h/db?password=xxxxx&user=u",
		"host=h user=u password=secret dbname=db":       "host=h user=u password=xxxxx dbname=db",
		"host=h password='se cret' dbname=db":           "host=h password=xxxxx dbname=db",
		"host=h dbname=db":                              "host=h dbname=db",
		"postgres://u:sec%zzret@h/db":                   "[unparsable connection URL]",
		"postgresql://u:p%40ss@h/db":                    "postgresql://u:xxxxx@h/db",
		"postgres://u:secret@h1:5432,h2:5433/db?a=b":    "postgres://u:xxxxx@h1:5432,h2:5433/db?a=b",
		"":                         "",
		"host=h PASSWORD = secret": "host=h PASSWORD = xxxxx",
		"postgres://u:secret@[::1]:5432/db?sslmode=full": "postgres://u:xxxxx@[::1]:5432/db?sslmode=full",
	}
	for in, want := range cases {
		if got := relayconfig.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestScrubPassword(t *testing.T) {
	t.Parallel()
	conn := "postgres://u:p%40ssword@h/db"
	got := relayconfig.ScrubPassword("auth failed for p@ssword and p%40ssword", conn)
	if got != "auth failed for xxxxx and xxxxx" {
		t.Errorf("ScrubPassword = %q", got)
	}
	if got := relayconfig.ScrubPassword("nothing here", "host=h password=hunter2"); got != "nothing here" {
		t.Errorf("ScrubPassword changed text without the password: %q", got)
	}
	if got := relayconfig.ScrubPassword("x hunter2 y", "host=h password=hunter2"); got != "x xxxxx y" {
		t.Errorf("ScrubPassword(key=value) = %q", got)
	}
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	relayconfig.Log{Level: "warn", Format: "json"}.NewLogger(&buf).Info("hidden")
	relayconfig.Log{Level: "warn", Format: "json"}.NewLogger(&buf).Warn("shown", "k", sinkconfig.Secret("s3cr3t"))
	out := buf.String()
	if strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) || strings.Contains(out, "s3cr3t") {
		t.Errorf("json/warn logger wrote %q", out)
	}
	buf.Reset()
	relayconfig.Log{}.NewLogger(&buf).Info("plain")
	relayconfig.Log{}.NewLogger(&buf).Debug("dropped")
	if out := buf.String(); !strings.Contains(out, "level=INFO msg=plain") || strings.Contains(out, "dropped") {
		t.Errorf("default logger wrote %q", out)
	}
}

// TestMySQLDatabaseURL: a mysql:// URL is a database URL (`relay migrate`
// serves it); one the MySQL driver cannot read is refused without its
// password.
func TestMySQLDatabaseURL(t *testing.T) {
	if _, err := relayconfig.Parse("relay.yaml", []byte(valid), envOf(map[string]string{"DATABASE_URL": "mysql://app:Secret-Pw-18@db:3306/app?parseTime=true"})); err != nil {
		t.Fatalf("a mysql:// DATABASE_URL: %v", err)
	}
	_, err := relayconfig.Parse("relay.yaml", []byte(valid), envOf(map[string]string{"DATABASE_URL": "mysql://app:Secret-Pw-18@db:3306/app?parseTime=maybe"}))
	if err == nil || !strings.Contains(err.Error(), "database.url") || strings.Contains(err.Error(), "Secret-Pw-18") {
		t.Fatalf("a mysql:// URL with a bad parameter: got %v, want an error naming database.url without the password", err)
	}
}
