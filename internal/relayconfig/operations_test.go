package relayconfig_test

import (
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/relayconfig"
)

const opsBase = `
database: {url: "postgres://u:Db-Pw-8@127.0.0.1:5432/test"}
sinks: [{name: a, type: stdout}, {name: b, type: discard}]
routes:
  - topics: ["orders.*"]
    sinks: [a, b]
  - topics: ["*"]
    sinks: [b]
`

func TestAdminSection(t *testing.T) {
	t.Parallel()
	env := func(name string) (string, bool) {
		if name == "ADMIN_TOKEN" {
			return "Tok-From-Env-123", true
		}
		return "", false
	}
	f, err := relayconfig.Parse("t.yaml", []byte(opsBase), env)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Admin.Enabled() || f.Admin.Config().Listen != "127.0.0.1:9090" || f.Admin.Config().ReadyPauseThreshold != time.Minute {
		t.Fatalf("defaults: %+v", f.Admin.Config())
	}
	f, err = relayconfig.Parse("t.yaml", []byte(opsBase+`admin: {listen: "", token: x}`), env)
	if err != nil || f.Admin.Enabled() {
		t.Fatalf(`listen "" must disable the server: %+v, %v`, f, err)
	}
	f, err = relayconfig.Parse("t.yaml", []byte(opsBase+`admin: {listen: "0.0.0.0:9191", token: "${ADMIN_TOKEN}", ready_pause_threshold: 30s}`), env)
	if err != nil {
		t.Fatal(err)
	}
	c := f.Admin.Config()
	if c.Listen != "0.0.0.0:9191" || c.Token.Reveal() != "Tok-From-Env-123" || c.ReadyPauseThreshold != 30*time.Second {
		t.Fatalf("admin = %+v", c)
	}
	for _, bad := range []struct{ text, want string }{
		{`admin: {listen: "0.0.0.0:9090"}`, "admin.token: required when admin.listen (0.0.0.0:9090) is not a loopback address"},
		{`admin: {listen: ":9090"}`, "admin.token: required"},
		{`admin: {listen: "9090"}`, "admin.listen:"},
		{`admin: {listne: "127.0.0.1:1"}`, "admin.listne: unknown key"},
		{`admin: {ready_pause_threshold: soon}`, "admin.ready_pause_threshold: invalid duration"},
		{`tracing: {sample_ratio: 1.5}`, "tracing.sample_ratio: must be from 0 to 1"},
		{`tracing: {otlp_endpoint: "collector:4318"}`, "tracing.otlp_endpoint: must be an http(s) URL"},
		{`tracing: {endpoint: "x"}`, "tracing.endpoint: unknown key"},
	} {
		_, err := relayconfig.Parse("t.yaml", []byte(opsBase+bad.text), env)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: got %v, want %q", bad.text, err, bad.want)
		}
		if err != nil && (strings.Contains(err.Error(), "Db-Pw-8") || strings.Contains(err.Error(), "Tok-From-Env-123")) {
			t.Errorf("%s: a secret is in the error: %v", bad.text, err)
		}
	}
}

// TestConsoleKeys: the console is on by default, off with console: false
// or without the admin server; read-only is off by default, and asking for
// it with the console off is an error naming the key.
func TestConsoleKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text              string
		enabled, readOnly bool
	}{
		{"", true, false},
		{`admin: {console: true, console_read_only: true}`, true, true},
		{`admin: {console: false}`, false, false},
		{`admin: {listen: ""}`, false, false},
	} {
		f, err := relayconfig.Parse("t.yaml", []byte(opsBase+tc.text), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.text, err)
		}
		if f.Admin.ConsoleEnabled() != tc.enabled || f.Admin.ConsoleReadOnly != tc.readOnly {
			t.Errorf("%q: console %v, read-only %v; want %v, %v", tc.text, f.Admin.ConsoleEnabled(), f.Admin.ConsoleReadOnly, tc.enabled, tc.readOnly)
		}
	}
	for _, bad := range []struct{ text, want string }{
		{`admin: {console: false, console_read_only: true}`, "admin.console_read_only: set, but the console is off"},
		{`admin: {listen: "", console_read_only: true}`, "admin.console_read_only: set, but the console is off"},
		{`admin: {console: maybe}`, "admin.console"},
	} {
		if _, err := relayconfig.Parse("t.yaml", []byte(opsBase+bad.text), nil); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: got %v, want %q", bad.text, err, bad.want)
		}
	}
}

func TestTracingSection(t *testing.T) {
	t.Parallel()
	f, err := relayconfig.Parse("t.yaml", []byte(opsBase), nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Tracing.Enabled() || f.Tracing.Ratio() != 1 {
		t.Fatalf("tracing defaults: %+v", f.Tracing)
	}
	f, err = relayconfig.Parse("t.yaml", []byte(opsBase+`tracing: {otlp_endpoint: "http://127.0.0.1:4318/v1/traces", sample_ratio: 0}`), nil)
	if err != nil || !f.Tracing.Enabled() || f.Tracing.Ratio() != 0 {
		t.Fatalf("tracing = %+v, %v", f.Tracing, err)
	}
}

func TestRouteSinks(t *testing.T) {
	t.Parallel()
	f, err := relayconfig.Parse("t.yaml", []byte(opsBase), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(f.RouteSinks("orders.paid"), ","); got != "a,b" {
		t.Fatalf("orders.paid → %s", got)
	}
	if got := strings.Join(f.RouteSinks("users"), ","); got != "b" {
		t.Fatalf("users → %s", got)
	}
}
