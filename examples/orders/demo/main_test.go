package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/examples/orders/internal/demo"
	"github.com/heraldhq/herald/internal/mqtttest"
	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/internal/rabbitmqtest"
	"github.com/heraldhq/herald/internal/redistest"
)

// repoRoot is the repository root, relative to this package.
const repoRoot = "../../.."

// demoBin is the demo, built once by TestMain: the README's commands are
// `go run ./examples/orders/demo ...`, which is this build and a run, and
// linking it once rather than per test keeps the package fast.
var demoBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "herald-demo-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	demoBin = filepath.Join(dir, "demo")
	build := exec.Command("go", "build", "-trimpath", "-o", demoBin, "./examples/orders/demo")
	build.Dir = repoRoot
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "go build ./examples/orders/demo:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runDemo runs the demo in the repository root with args and extra
// environment (DATABASE_URL and DOCKER_HOST removed unless given), within
// five minutes.
func runDemo(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return runIn(ctx, t, repoRoot, env, demoBin, args...)
}

func runIn(ctx context.Context, t *testing.T, dir string, env []string, name string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "DOCKER_HOST=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s %v: %v", name, args, err)
	}
	return out.String(), errb.String(), code
}

// TestReadmeDemoCommand runs the README's first command, `go run
// ./examples/orders/demo`, short and as JSON, and checks the summary's
// numbers and that the JSON durations say their unit.
func TestReadmeDemoCommand(t *testing.T) {
	t.Parallel()
	// Without --schema, as the README runs it: the demo works in a fresh
	// schema of its own, named in the summary.
	stdout, stderr, code := runDemo(t, []string{"DATABASE_URL=" + pgtest.URL(t)}, "--short", "--json")
	if code != 0 {
		t.Fatalf("go run ./examples/orders/demo --short --json: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	var s demo.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, stdout)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("summary does not add up: %v\n%s", err, stdout)
	}
	routed := map[string]int{"nats": 200, "webhook": 200, "email": 100}
	for _, k := range s.Sinks {
		if k.Published != routed[k.Name] || k.Routed != routed[k.Name] || k.Latency.P50 <= 0 {
			t.Fatalf("sink %s: %+v", k.Name, k)
		}
	}
	if s.OrdersPaid != 100 || s.DeadLettered != 2 || s.Replayed != 2 || s.Retried == 0 || s.Latency.P99 <= 0 {
		t.Fatalf("summary: %s", stdout)
	}
	for _, field := range []string{`"p50_ms"`, `"p99_ms"`, `"max_ms"`, `"outage_ms"`, `"elapsed_ms"`} {
		if !strings.Contains(stdout, field) {
			t.Errorf("the JSON summary has no %s field:\n%s", field, stdout)
		}
	}
	if !strings.Contains(stderr, "orders 100/100 paid") {
		t.Fatalf("no progress on stderr:\n%s", stderr)
	}
	schema := s.Schema
	if !regexp.MustCompile(`^`+demo.DefaultSchema+`_[0-9a-f]{8}$`).MatchString(schema) ||
		!strings.Contains(stderr, "schema "+schema+" migrated; dropped at the end") {
		t.Fatalf("the run's schema %q is not a fresh name it announced:\n%s", schema, stderr)
	}
	var n int
	if err := pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("schema %s left behind", schema)
	}
}

// TestReadmeDemoOnMySQL runs the README's demo command on MariaDB/MySQL
// (--database-url mysql://...), small, and checks that the summary adds
// up and that the demo's database is dropped at the end.
func TestReadmeDemoOnMySQL(t *testing.T) {
	t.Parallel()
	url := mysqltest.URL(t)
	schema := mysqltest.UniqueName(demo.DefaultSchema)
	stdout, stderr, code := runDemo(t, nil,
		"--short", "--orders", "20", "--json", "--database-url", url, "--schema", schema)
	if code != 0 {
		t.Fatalf("go run ./examples/orders/demo --short --orders 20 --json --database-url %s: exit %d\nstdout:\n%s\nstderr:\n%s", url, code, stdout, stderr)
	}
	var s demo.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, stdout)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("summary does not add up: %v\n%s", err, stdout)
	}
	routed := map[string]int{"nats": 40, "webhook": 40, "email": 20}
	for _, k := range s.Sinks {
		if k.Published != routed[k.Name] || k.Routed != routed[k.Name] || k.Latency.P50 <= 0 {
			t.Fatalf("sink %s: %+v", k.Name, k)
		}
	}
	if s.OrdersPaid != 20 || s.DeadLettered != 1 || s.Replayed != 1 || s.Schema != schema {
		t.Fatalf("summary: %s", stdout)
	}
	if !strings.Contains(stderr, "demo: MySQL mysql://") || !strings.Contains(stderr, "schema "+schema+" migrated") {
		t.Fatalf("the demo did not say it migrated database %s on MySQL:\n%s", schema, stderr)
	}
	db, err := mysqlurl.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(context.Background(),
		"SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?", schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database %s left behind", schema)
	}
}

// TestDemoBinaryErrors: no server answers and no Docker engine either, so
// the demo says what to run and exits 1; so does a -sinks naming an
// unknown sink or a server that does not answer; bad flags exit 2.
func TestDemoBinaryErrors(t *testing.T) {
	t.Parallel()
	run := func(env []string, args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, stderr, code := runIn(ctx, t, ".", env, demoBin, args...)
		return stderr, code
	}

	stderr, code := run([]string{"DOCKER_HOST=unix:///nonexistent/docker.sock"},
		"--short", "--database-url", "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if code != 1 || !strings.Contains(stderr, "docker run -d --name herald-pg -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:17") {
		t.Fatalf("no database: exit %d, stderr:\n%s", code, stderr)
	}
	stderr, code = run(nil, "--short", "--database-url", "mysql://root@127.0.0.1:1/none")
	if code != 1 || !strings.Contains(stderr, "no MySQL or MariaDB answers at mysql://root@127.0.0.1:1/none") || !strings.Contains(stderr, "docker run -d --name herald-mariadb") {
		t.Fatalf("no MySQL: exit %d, stderr:\n%s", code, stderr)
	}
	// A server that answers without the URL's database: the database is
	// missing, not the server.
	missing, err := url.Parse(mysqltest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	missing.Path = "/" + mysqltest.UniqueName("no_such_db")
	stderr, code = run(nil, "--short", "--database-url", missing.String())
	if code != 1 || !strings.Contains(stderr, "answers, but has no database "+missing.Path[1:]) ||
		!strings.Contains(stderr, "CREATE DATABASE `"+missing.Path[1:]+"`") || strings.Contains(stderr, "no MySQL or MariaDB answers") ||
		strings.Contains(stderr, "docker run") {
		t.Fatalf("a missing MySQL database: exit %d, stderr:\n%s", code, stderr)
	}
	stderr, code = run(nil, "--schema", "public", "--database-url", "postgres://postgres@127.0.0.1:1/none")
	if code != 1 || !strings.Contains(stderr, `must start with "herald_demo"`) {
		t.Fatalf("--schema public: exit %d, stderr:\n%s", code, stderr)
	}
	stderr, code = run(nil, "--orders", "many")
	if code != 2 || !strings.Contains(stderr, `invalid value "many" for flag -orders`) {
		t.Fatalf("--orders many: exit %d, stderr:\n%s", code, stderr)
	}
	stderr, code = run([]string{"DATABASE_URL=" + pgtest.URL(t)}, "--sinks", "redis,kafka")
	if code != 1 || !strings.Contains(stderr, `sinks: unknown sink "kafka" (known: redis, rabbitmq, mqtt, pubsub, sqs, sns)`) {
		t.Fatalf("--sinks redis,kafka: exit %d, stderr:\n%s", code, stderr)
	}
	stderr, code = run([]string{"DATABASE_URL=" + pgtest.URL(t), "REDIS_URL=redis://127.0.0.1:1/0"}, "--short", "--sinks", "redis", "--schema", pgtest.UniqueName(demo.DefaultSchema))
	if code != 1 || !strings.Contains(stderr, "redis sink: no Redis at redis://127.0.0.1:1/0") || !strings.Contains(stderr, "leave redis out") {
		t.Fatalf("--sinks redis with no Redis: exit %d, stderr:\n%s", code, stderr)
	}
	// Without moto_server (a PATH without Python's shims) and no
	// AWS_ENDPOINT_URL, the demo says what to install.
	stderr, code = run([]string{"DATABASE_URL=" + pgtest.URL(t), "PATH=/usr/bin:/bin", "AWS_ENDPOINT_URL="}, "--short", "--sinks", "sqs", "--schema", pgtest.UniqueName(demo.DefaultSchema))
	if code != 1 || !strings.Contains(stderr, "sqs sink: moto_server is not on PATH: install it (pip install 'moto[server]')") {
		t.Fatalf("--sinks sqs without moto_server: exit %d, stderr:\n%s", code, stderr)
	}
	stderr, code = run(nil, "extra")
	if code != 2 || !strings.Contains(stderr, `unexpected argument "extra"`) {
		t.Fatalf("an argument: exit %d, stderr:\n%s", code, stderr)
	}
}

// TestReadmeDemoWithBrokerSinks runs the README's demo command with
// --sinks redis,rabbitmq,mqtt against the machine's Redis, RabbitMQ and
// Mosquitto: each of them must receive every orders.* event, as read by
// the demo's own consumers (XREAD, an AMQP queue, a QoS 1 subscription),
// and the summary must add up.
func TestReadmeDemoWithBrokerSinks(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=" + pgtest.URL(t), "REDIS_URL=" + redistest.URL(t),
		"RABBITMQ_URL=" + rabbitmqtest.URL(t), "MQTT_URL=" + mqtttest.URL(t)}
	schema := pgtest.UniqueName(demo.DefaultSchema)
	stdout, stderr, code := runDemo(t, env,
		"--short", "--json", "--sinks", "redis,rabbitmq,mqtt", "--schema", schema)
	if code != 0 {
		t.Fatalf("go run ./examples/orders/demo --short --json --sinks redis,rabbitmq,mqtt: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	var s demo.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, stdout)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("summary does not add up: %v\n%s", err, stdout)
	}
	routed := map[string]int{"nats": 200, "webhook": 200, "email": 100, "redis": 200, "rabbitmq": 200, "mqtt": 200}
	if len(s.Sinks) != len(routed) {
		t.Fatalf("sinks in the summary: %+v, want %v", s.Sinks, routed)
	}
	for _, k := range s.Sinks {
		if k.Published != routed[k.Name] || k.Routed != routed[k.Name] || k.Latency.P50 <= 0 {
			t.Fatalf("sink %s: %+v", k.Name, k)
		}
	}
	for _, name := range []string{"redis", "rabbitmq", "mqtt"} {
		if !strings.Contains(stderr, "demo: "+name+" sink, delivering to ") {
			t.Errorf("the demo did not say where the %s sink delivers:\n%s", name, stderr)
		}
	}
}

// TestReadmeDemoWithCloudSinks runs the README's demo command with --sinks
// pubsub,sqs,sns: Pub/Sub goes to the fake the demo runs in its process,
// SQS and SNS to the moto_server it starts (AWS_ENDPOINT_URL unset). Each
// must receive every orders.* event, as the demo's consumers read them
// back, and the summary must add up.
func TestReadmeDemoWithCloudSinks(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("moto_server"); err != nil {
		msg := "moto_server is not on PATH (pip install 'moto[server]'): " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	env := []string{"DATABASE_URL=" + pgtest.URL(t), "AWS_ENDPOINT_URL="}
	schema := pgtest.UniqueName(demo.DefaultSchema)
	stdout, stderr, code := runDemo(t, env,
		"--short", "--orders", "20", "--json", "--sinks", "pubsub,sqs,sns", "--schema", schema)
	if code != 0 {
		t.Fatalf("go run ./examples/orders/demo --short --orders 20 --json --sinks pubsub,sqs,sns: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	var s demo.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, stdout)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("summary does not add up: %v\n%s", err, stdout)
	}
	// 20 orders (moto, the SQS and SNS peer, takes about a second per FIFO
	// message on a loaded machine): each is created and paid.
	routed := map[string]int{"nats": 40, "webhook": 40, "email": 20, "pubsub": 40, "sqs": 40, "sns": 40}
	if len(s.Sinks) != len(routed) {
		t.Fatalf("sinks in the summary: %+v, want %v", s.Sinks, routed)
	}
	for _, k := range s.Sinks {
		if k.Published != routed[k.Name] || k.Routed != routed[k.Name] || k.Latency.P50 <= 0 {
			t.Fatalf("sink %s: %+v", k.Name, k)
		}
	}
	for _, name := range []string{"pubsub", "sqs", "sns"} {
		if !strings.Contains(stderr, "demo: "+name+" sink, delivering to ") {
			t.Errorf("the demo did not say where the %s sink delivers:\n%s", name, stderr)
		}
	}
	if !strings.Contains(stderr, "demo: moto_server http://127.0.0.1:") {
		t.Errorf("the demo did not say it started moto_server:\n%s", stderr)
	}
}
