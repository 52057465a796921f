package main

// Checks of the repository's Dockerfile and docker-compose.yml. No Docker
// engine runs where the tests do, so the files are parsed and checked for
// what would break `docker compose up`, and the relay binary is built with
// the Dockerfile's own command and flags, then run.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// repoRoot is the repository root, relative to this package.
const repoRoot = "../.."

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	keyword string // upper case
	args    string
	line    int
}

// stage is one FROM and the instructions after it.
type stage struct {
	name, from string
	body       []instruction
}

func parseDockerfile(t *testing.T, path string) (args map[string]string, stages []*stage) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args = map[string]string{}
	sc := bufio.NewScanner(f)
	var (
		pending string
		start   int
		n       int
	)
	flush := func() {
		text := strings.TrimSpace(pending)
		pending = ""
		if text == "" {
			return
		}
		keyword, rest, _ := strings.Cut(text, " ")
		in := instruction{keyword: strings.ToUpper(keyword), args: strings.TrimSpace(rest), line: start}
		switch in.keyword {
		case "FROM":
			fields := strings.Fields(in.args)
			s := &stage{from: fields[0]}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			}
			stages = append(stages, s)
		case "ARG":
			name, def, _ := strings.Cut(in.args, "=")
			args[name] = def
			fallthrough
		default:
			if len(stages) == 0 {
				if in.keyword != "ARG" {
					t.Fatalf("%s:%d: %s before the first FROM", path, in.line, in.keyword)
				}
				return
			}
			stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
		}
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		if pending == "" {
			if trimmed := strings.TrimSpace(line); trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			start = n
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok {
			pending += cont + " "
			continue
		}
		pending += line
		flush()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	flush()
	return args, stages
}

// shellWords splits a RUN command into words, honouring double and single
// quotes (enough for the Dockerfile's go build lines).
func shellWords(s string) []string {
	var (
		words []string
		cur   strings.Builder
		quote rune
		in    bool
	)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// goBuild is a `go build` RUN line of the Dockerfile.
type goBuild struct {
	env     []string // NAME=value before go
	flags   []string // between build and the package, without -o
	output  string
	pkg     string
	rawLine int
}

var argRef = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

func parseGoBuild(t *testing.T, in instruction, args map[string]string) (goBuild, bool) {
	t.Helper()
	words := shellWords(in.args)
	i := 0
	var b goBuild
	for ; i < len(words) && strings.Contains(words[i], "=") && !strings.HasPrefix(words[i], "-"); i++ {
		b.env = append(b.env, words[i])
	}
	if i+1 >= len(words) || words[i] != "go" || words[i+1] != "build" {
		return b, false
	}
	rest := words[i+2:]
	for j := 0; j < len(rest); j++ {
		w := argRef.ReplaceAllStringFunc(rest[j], func(ref string) string {
			m := argRef.FindStringSubmatch(ref)
			name := m[1] + m[2]
			v, ok := args[name]
			if !ok {
				t.Fatalf("Dockerfile:%d: $%s is no ARG", in.line, name)
			}
			return v
		})
		switch {
		case w == "-o" && j+1 < len(rest):
			b.output = rest[j+1]
			j++
		case j == len(rest)-1:
			b.pkg = w
		default:
			b.flags = append(b.flags, w)
		}
	}
	b.rawLine = in.line
	return b, true
}

// dockerfileBuilds returns the Dockerfile's ARG defaults, stages and the go
// build lines of its build stage, checking the stages on the way.
func dockerfileBuilds(t *testing.T) ([]*stage, []goBuild) {
	t.Helper()
	args, stages := parseDockerfile(t, filepath.Join(repoRoot, "Dockerfile"))
	byName := map[string]*stage{}
	var builds []goBuild
	for i, s := range stages {
		if byName[s.from] == nil && !pinned(s.from) {
			t.Errorf("Dockerfile: stage %d (%s) FROM %s: pin the image to a version (not latest)", i, s.name, s.from)
		}
		for _, in := range s.body {
			if in.keyword != "RUN" {
				continue
			}
			if b, ok := parseGoBuild(t, in, args); ok {
				builds = append(builds, b)
			}
		}
		if s.name != "" {
			byName[s.name] = s
		}
	}
	return stages, builds
}

// pinned reports whether an image reference names a version: a digest, or
// a tag other than latest.
func pinned(image string) bool {
	if strings.Contains(image, "@sha256:") {
		return true
	}
	slash := strings.LastIndex(image, "/")
	_, tag, ok := strings.Cut(image[slash+1:], ":")
	return ok && tag != "" && tag != "latest"
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	stages, builds := dockerfileBuilds(t)
	names := map[string]*stage{}
	for _, s := range stages {
		names[s.name] = s
	}
	for _, want := range []string{"build", "relay", "orders", "consumer"} {
		if names[want] == nil {
			t.Fatalf("Dockerfile: no stage %q", want)
		}
	}
	if last := stages[len(stages)-1]; last.name != "relay" {
		t.Errorf("Dockerfile: the last stage (the default target) is %q, want relay", last.name)
	}
	outputs := map[string]goBuild{}
	for _, b := range builds {
		outputs[b.output] = b
		if !slices.Contains(b.env, "CGO_ENABLED=0") {
			t.Errorf("Dockerfile:%d: go build without CGO_ENABLED=0 makes a binary distroless/static cannot run", b.rawLine)
		}
		dir := filepath.Join(repoRoot, filepath.FromSlash(b.pkg))
		if src, err := os.ReadFile(filepath.Join(dir, "main.go")); err != nil || !strings.Contains(string(src), "package main") {
			t.Errorf("Dockerfile:%d: %s is not a main package (%v)", b.rawLine, b.pkg, err)
		}
	}
	if _, ok := outputs["/out/relay"]; !ok || outputs["/out/relay"].pkg != "./cmd/relay" {
		t.Fatalf("Dockerfile: no `go build -o /out/relay ./cmd/relay` (outputs %v)", outputs)
	}
	// Every runtime stage copies a binary the build stage made, runs as a
	// non-root user and starts it.
	for _, name := range []string{"relay", "orders", "consumer"} {
		s := names[name]
		var copied, user, entry string
		for _, in := range s.body {
			switch in.keyword {
			case "COPY":
				if f := strings.Fields(in.args); len(f) == 3 && f[0] == "--from=build" {
					copied = f[1]
					if _, ok := outputs[f[1]]; !ok {
						t.Errorf("Dockerfile:%d: copies %s, which no go build makes", in.line, f[1])
					}
				}
			case "USER":
				user = in.args
			case "ENTRYPOINT":
				var argv []string
				if err := json.Unmarshal([]byte(in.args), &argv); err != nil || len(argv) == 0 {
					t.Errorf("Dockerfile:%d: ENTRYPOINT must be an exec-form JSON array (distroless has no shell)", in.line)
				} else {
					entry = argv[0]
				}
			}
		}
		if copied == "" || entry != "/"+filepath.Base(copied) {
			t.Errorf("Dockerfile stage %s: copies %q but starts %q", name, copied, entry)
		}
		if user == "" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
			t.Errorf("Dockerfile stage %s: runs as %q; want a non-root USER", name, user)
		}
	}
	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ignore), "\n") {
		line = strings.TrimSpace(line)
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "examples", "relay", "sinks", "outbox", "migrations"} {
			if line == needed || line == needed+"/" || line == "*" {
				t.Errorf(".dockerignore excludes %s, which the build needs", needed)
			}
		}
	}
}

// compose is the part of docker-compose.yml the checks read.
type compose struct {
	Name     string              `yaml:"name"`
	Services map[string]*service `yaml:"services"`
	Volumes  map[string]any      `yaml:"volumes"`
}

type service struct {
	Image       string            `yaml:"image"`
	Build       *buildSpec        `yaml:"build"`
	Command     []string          `yaml:"command"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test        []string `yaml:"test"`
		Interval    string   `yaml:"interval"`
		Timeout     string   `yaml:"timeout"`
		Retries     int      `yaml:"retries"`
		StartPeriod string   `yaml:"start_period"`
	} `yaml:"healthcheck"`
	Restart string `yaml:"restart"`
}

type buildSpec struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
	Target     string `yaml:"target"`
}

func loadCompose(t *testing.T) *compose {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v (the test knows the keys it uses; add new ones to the service struct)", err)
	}
	if len(c.Services) == 0 {
		t.Fatal("docker-compose.yml: no services")
	}
	return &c
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}`)

func TestCompose(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	stages, _ := dockerfileBuilds(t)
	stageNames := map[string]bool{}
	for _, s := range stages {
		stageNames[s.name] = true
	}
	for _, want := range []string{"postgres", "kafka", "nats", "mailpit", "migrate", "relay", "orders", "consumer"} {
		if c.Services[want] == nil {
			t.Errorf("docker-compose.yml: no %s service", want)
		}
	}
	hostPorts := map[string]string{}
	// The services a developer runs locally (README, the tests) and the
	// relay's default admin listener: the stack must start beside them.
	localPorts := map[string]string{"5432": "PostgreSQL", "3306": "MariaDB", "4222": "NATS", "6379": "Redis",
		"5672": "RabbitMQ", "1883": "Mosquitto", "9090": "relay run's admin server"}
	for name, s := range c.Services {
		switch {
		case s.Build != nil:
			ctx := filepath.Join(repoRoot, s.Build.Context)
			df := s.Build.Dockerfile
			if df == "" {
				df = "Dockerfile"
			}
			if _, err := os.Stat(filepath.Join(ctx, df)); err != nil {
				t.Errorf("service %s: build: %v", name, err)
			}
			if s.Build.Target != "" && !stageNames[s.Build.Target] {
				t.Errorf("service %s: build target %q is no stage of the Dockerfile", name, s.Build.Target)
			}
		case s.Image == "":
			t.Errorf("service %s: neither image nor build", name)
		case !pinned(s.Image):
			t.Errorf("service %s: image %s is not pinned to a version", name, s.Image)
		}
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			if len(parts) < 2 {
				continue // container port only: nothing published
			}
			host := strings.Join(parts[:len(parts)-1], ":")
			if other, ok := hostPorts[host]; ok {
				t.Errorf("services %s and %s both publish host port %s", other, name, host)
			}
			hostPorts[host] = name
			if local, ok := localPorts[parts[len(parts)-2]]; ok {
				t.Errorf("service %s publishes host port %s, where %s runs locally: pick another host port", name, host, local)
			}
		}
		if h := s.Healthcheck; h != nil {
			if len(h.Test) < 2 || h.Test[0] != "CMD" && h.Test[0] != "CMD-SHELL" {
				t.Errorf("service %s: healthcheck test %v is not [CMD, ...] or [CMD-SHELL, ...]", name, h.Test)
			}
			for _, d := range []string{h.Interval, h.Timeout, h.StartPeriod} {
				if _, err := time.ParseDuration(d); d != "" && err != nil {
					t.Errorf("service %s: healthcheck: %v", name, err)
				}
			}
		}
		for dep, d := range s.DependsOn {
			target := c.Services[dep]
			switch {
			case target == nil:
				t.Errorf("service %s depends on %s, which does not exist", name, dep)
			case d.Condition == "service_healthy" && (target.Healthcheck == nil || len(target.Healthcheck.Test) == 0):
				t.Errorf("service %s waits for %s to be healthy, which has no healthcheck", name, dep)
			case d.Condition == "service_completed_successfully" && target.Restart != "no":
				t.Errorf("service %s waits for %s to complete, which should be restart: \"no\"", name, dep)
			case d.Condition != "service_healthy" && d.Condition != "service_completed_successfully" && d.Condition != "service_started":
				t.Errorf("service %s: depends_on %s: unknown condition %q", name, dep, d.Condition)
			}
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
					t.Errorf("service %s mounts %s: %v", name, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok && !strings.HasPrefix(src, "/") {
				t.Errorf("service %s mounts volume %q, not declared under volumes", name, src)
			}
		}
	}
	// depends_on has no cycle.
	state := map[string]int{}
	var visit func(string, []string)
	visit = func(name string, path []string) {
		switch state[name] {
		case 1:
			t.Errorf("depends_on cycle: %s", strings.Join(append(path, name), " → "))
			return
		case 2:
			return
		}
		state[name] = 1
		if s := c.Services[name]; s != nil {
			for dep := range s.DependsOn {
				visit(dep, append(path, name))
			}
		}
		state[name] = 2
	}
	for name := range c.Services {
		visit(name, nil)
	}

	// The relay: its configuration is mounted where its command reads it,
	// and every ${NAME} of relay.yaml is set in its environment.
	relaySvc := c.Services["relay"]
	cfgPath := ""
	for i, arg := range relaySvc.Command {
		if arg == "--config" && i+1 < len(relaySvc.Command) {
			cfgPath = relaySvc.Command[i+1]
		}
	}
	mounted := map[string]string{}
	for _, v := range relaySvc.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 {
			mounted[parts[1]] = parts[0]
		}
	}
	if cfgPath == "" || filepath.Clean(mounted[cfgPath]) != "examples/orders/relay.yaml" {
		t.Fatalf("relay service: --config %q is not the mounted examples/orders/relay.yaml (mounts %v)", cfgPath, mounted)
	}
	if dir := relaySvc.Environment["TEMPLATES_DIR"]; filepath.Clean(mounted[dir]) != "examples/orders/templates" {
		t.Errorf("relay service: TEMPLATES_DIR %q is not where examples/orders/templates is mounted (mounts %v)", dir, mounted)
	}
	yamlText, err := os.ReadFile("relay.yaml")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{"DATABASE_URL": true} // overrides database.url
	for _, m := range envRef.FindAllStringSubmatch(string(yamlText), -1) {
		used[m[1]] = true
		if _, ok := relaySvc.Environment[m[1]]; !ok {
			t.Errorf("relay.yaml uses ${%s}, which the relay service's environment does not set", m[1])
		}
	}
	for name := range relaySvc.Environment {
		if !used[name] {
			t.Errorf("relay service sets %s, which relay.yaml does not use", name)
		}
	}
	// With that environment, as compose interpolates it from a shell that
	// exported ADMIN_TOKEN, the file loads: every value parses and
	// validates, the admin listener among them (not loopback, so it needs
	// its token).
	relayEnv, err := interpolate(relaySvc.Environment, map[string]string{"ADMIN_TOKEN": "compose-test-token"})
	if err != nil {
		t.Fatal(err)
	}
	env := func(k string) (string, bool) { v, ok := relayEnv[k]; return v, ok }
	file, err := relayconfig.Load("relay.yaml", env)
	if err != nil {
		t.Fatalf("relay.yaml with the relay service's environment: %v", err)
	}
	adminCfg := file.Admin.Config()
	if !file.Admin.Enabled() || adminCfg.Token.Reveal() != "compose-test-token" {
		t.Errorf("relay.yaml in compose: admin server enabled %v, token %q; want it on, with $ADMIN_TOKEN", file.Admin.Enabled(), adminCfg.Token.Reveal())
	}
	_, adminPort, err := net.SplitHostPort(adminCfg.Listen)
	if err != nil {
		t.Fatalf("admin.listen %q: %v", adminCfg.Listen, err)
	}
	if published := publishedPorts(relaySvc)[adminPort]; published == "" {
		t.Errorf("the relay service does not publish its admin port %s (ports %v)", adminPort, relaySvc.Ports)
	}
	// A shell that did not export ADMIN_TOKEN: compose refuses to start,
	// saying what to do, rather than publish a dead-letter API without one.
	if _, err := interpolate(relaySvc.Environment, nil); err == nil || !strings.Contains(err.Error(), "export ADMIN_TOKEN") {
		t.Errorf("compose without ADMIN_TOKEN: %v, want an error saying to export it", err)
	}
	// Outside compose (the loopback default) the file loads without a token.
	if _, err := relayconfig.Load("relay.yaml", func(k string) (string, bool) {
		v, ok := relaySvc.Environment[k]
		return v, ok && !strings.HasPrefix(k, "ADMIN_")
	}); err != nil {
		t.Errorf("relay.yaml without ADMIN_LISTEN and ADMIN_TOKEN: %v", err)
	}
	// The relay and migrate services reach the same database.
	if c.Services["migrate"].Environment["DATABASE_URL"] != relaySvc.Environment["DATABASE_URL"] {
		t.Error("migrate and relay services use different DATABASE_URLs")
	}

	// The example's programs read every variable their service sets.
	for name, src := range map[string]string{"orders": "main.go", "consumer": "consumer/main.go"} {
		code, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		for k := range c.Services[name].Environment {
			if !strings.Contains(string(code), `"`+k+`"`) {
				t.Errorf("service %s sets %s, which %s never reads", name, k, src)
			}
		}
	}
	// Orders creates the stream the relay's NATS destination writes to, and
	// the consumer reads it.
	if o, r, k := c.Services["orders"].Environment, relaySvc.Environment, c.Services["consumer"].Environment; o["NATS_SUBJECT_PREFIX"] != r["NATS_SUBJECT_PREFIX"] || o["NATS_STREAM"] != k["NATS_STREAM"] {
		t.Errorf("NATS stream and prefix differ: orders %s/%s, relay prefix %s, consumer stream %s",
			o["NATS_STREAM"], o["NATS_SUBJECT_PREFIX"], r["NATS_SUBJECT_PREFIX"], k["NATS_STREAM"])
	}
	if r, k := relaySvc.Environment, c.Services["consumer"].Environment; r["WEBHOOK_SECRET"] != k["WEBHOOK_SECRET"] ||
		!strings.HasPrefix(r["WEBHOOK_URL"], "http://consumer"+strings.TrimPrefix(k["WEBHOOK_LISTEN"], "0.0.0.0")+"/webhook") {
		t.Errorf("the relay's webhook (%s) is not the consumer's receiver (%s) or the secrets differ", r["WEBHOOK_URL"], k["WEBHOOK_LISTEN"])
	}
	if r, k := relaySvc.Environment, c.Services["consumer"].Environment; r["KAFKA_TOPIC"] != k["KAFKA_TOPICS"] ||
		!slices.Contains(c.Services["kafka-init"].Command, r["KAFKA_TOPIC"]) {
		t.Errorf("Kafka topic: relay writes %q, consumer reads %q, kafka-init creates %v", r["KAFKA_TOPIC"], k["KAFKA_TOPICS"], c.Services["kafka-init"].Command)
	}
}

var (
	relayBinOnce sync.Once
	relayBinPath string
	relayBinErr  error
)

// relayBinary builds ./cmd/relay exactly as the Dockerfile does (its env,
// flags and ARG defaults), once per test run.
func relayBinary(t *testing.T) string {
	t.Helper()
	_, builds := dockerfileBuilds(t)
	relayBinOnce.Do(func() {
		var b *goBuild
		for i := range builds {
			if builds[i].pkg == "./cmd/relay" {
				b = &builds[i]
			}
		}
		if b == nil {
			relayBinErr = fmt.Errorf("the Dockerfile builds no ./cmd/relay")
			return
		}
		dir, err := os.MkdirTemp("", "herald-docker-build")
		if err != nil {
			relayBinErr = err
			return
		}
		relayBinPath = filepath.Join(dir, "relay")
		args := append(append([]string{"build"}, b.flags...), "-o", relayBinPath, b.pkg)
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			relayBinErr = fmt.Errorf("%s go %s: %v\n%s", strings.Join(b.env, " "), strings.Join(args, " "), err, out)
		}
	})
	if relayBinErr != nil {
		t.Fatal(relayBinErr)
	}
	t.Cleanup(func() {}) // the binary is removed with the temporary directory by the OS
	return relayBinPath
}

// runBinary runs bin with args and extra environment (DATABASE_URL removed
// unless given), within a minute.
func runBinary(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
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
		t.Fatalf("running %s %v: %v", bin, args, err)
	}
	return out.String(), errb.String(), code
}

// TestRelayBinary runs the relay built the Dockerfile's way. The demo is not
// one of its commands: it lives in ./examples/orders/demo, so that the
// production image carries no embedded test servers.
func TestRelayBinary(t *testing.T) {
	t.Parallel()
	bin := relayBinary(t)
	stdout, _, code := runBinary(t, bin, nil, "version")
	if code != 0 || !strings.HasPrefix(stdout, "relay dev (go") {
		t.Fatalf("relay version (VERSION=dev in the Dockerfile): exit %d, %q", code, stdout)
	}
	_, stderr, code := runBinary(t, bin, nil, "demo")
	if code != 2 || !strings.Contains(stderr, `unknown command "demo"`) {
		t.Fatalf("relay demo: exit %d (want 2, unknown command), stderr:\n%s", code, stderr)
	}
}

// composeVar matches compose's interpolation: $$, ${NAME}, ${NAME:-default}
// and ${NAME:?error}.
var composeVar = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-?])([^}]*))?\}`)

// interpolate returns env with compose's interpolation done against the
// shell environment shell, or the first ${NAME:?error} whose NAME is
// unset or empty.
func interpolate(env, shell map[string]string) (map[string]string, error) {
	out := map[string]string{}
	var err error
	for k, v := range env {
		out[k] = composeVar.ReplaceAllStringFunc(v, func(ref string) string {
			if ref == "$$" {
				return "$"
			}
			m := composeVar.FindStringSubmatch(ref)
			val := shell[m[1]]
			switch {
			case val != "":
				return val
			case m[2] == "-":
				return m[3]
			case m[2] == "?" && err == nil:
				err = fmt.Errorf("%s: required variable %s is missing a value: %s", k, m[1], m[3])
			}
			return ""
		})
	}
	return out, err
}

// publishedPorts maps the container ports a service publishes to their
// host ports.
func publishedPorts(s *service) map[string]string {
	out := map[string]string{}
	for _, p := range s.Ports {
		parts := strings.Split(p, ":")
		if len(parts) >= 2 {
			out[parts[len(parts)-1]] = parts[len(parts)-2]
		}
	}
	return out
}

// readmeComposeBlock returns the README's docker compose commands: the sh
// block under "### docker compose".
func readmeComposeBlock(t *testing.T) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(text), "\n### docker compose\n")
	if !ok {
		t.Fatal("README: no ### docker compose section")
	}
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("README: the docker compose section has no sh block")
	}
	return m[1]
}

// TestComposeREADMECommands checks the README's docker compose commands
// against docker-compose.yml and the Dockerfile, as far as they can be
// without a Docker engine: ADMIN_TOKEN is exported before the stack
// starts; every localhost port they reach is one a service publishes (the
// relay's admin port among them, with the token for /dlq); every service
// they name exists; an exec runs the binary where the service's image
// has it (distroless: no shell, no PATH lookup of /relay).
func TestComposeREADMECommands(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	_, stages := parseDockerfile(t, filepath.Join(repoRoot, "Dockerfile"))
	entrypoints := map[string]string{}
	for _, s := range stages {
		for _, in := range s.body {
			var argv []string
			if in.keyword == "ENTRYPOINT" && json.Unmarshal([]byte(in.args), &argv) == nil && len(argv) > 0 {
				entrypoints[s.name] = argv[0]
			}
		}
	}
	hostPorts := map[string]string{} // host port -> service
	for name, s := range c.Services {
		for _, host := range publishedPorts(s) {
			hostPorts[host] = name
		}
	}
	block := readmeComposeBlock(t)
	lines := strings.Split(strings.TrimSpace(block), "\n")
	up := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "docker compose up") })
	exported := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "export ADMIN_TOKEN=") })
	if up < 0 || exported < 0 || exported > up {
		t.Errorf("README: export ADMIN_TOKEN=... must come before docker compose up:\n%s", block)
	}
	admin := publishedPorts(c.Services["relay"])["9090"]
	var sawMetrics, sawDLQ bool
	for _, line := range lines {
		for _, m := range regexp.MustCompile(`localhost:(\d+)(/\S*)?`).FindAllStringSubmatch(line, -1) {
			svc, ok := hostPorts[m[1]]
			if !ok {
				t.Errorf("README: %q reaches localhost:%s, which no service publishes", line, m[1])
				continue
			}
			if svc == "relay" && m[1] == admin {
				switch {
				case strings.HasPrefix(m[2], "/metrics"):
					sawMetrics = true
				case strings.HasPrefix(m[2], "/dlq"):
					sawDLQ = true
					if !strings.Contains(line, `Authorization: Bearer $ADMIN_TOKEN`) {
						t.Errorf("README: %q calls the dead-letter API without the token", line)
					}
				}
			}
		}
		fields := strings.Fields(regexp.MustCompile(`\s+#\s.*$`).ReplaceAllString(line, ""))
		if len(fields) >= 4 && fields[0] == "docker" && fields[1] == "compose" {
			var svc string
			switch fields[2] {
			case "exec":
				svc = fields[3]
				s := c.Services[svc]
				if s == nil || s.Build == nil {
					t.Errorf("README: %q: no service %s built from the Dockerfile", line, svc)
					continue
				}
				if want := entrypoints[s.Build.Target]; len(fields) < 5 || fields[4] != want {
					t.Errorf("README: %q: the %s image has its binary at %s", line, svc, want)
				}
			case "logs":
				svc = fields[len(fields)-1]
				if c.Services[svc] == nil {
					t.Errorf("README: %q: no service %s", line, svc)
				}
			}
		}
	}
	if !sawMetrics || !sawDLQ {
		t.Errorf("README: the compose commands should reach the relay's /metrics and /dlq on localhost:%s (metrics %v, dlq %v)", admin, sawMetrics, sawDLQ)
	}
}
