package relayconfig_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// TestLoadReadOnly: the variables of the sections a read-only command does
// not read need not be set, nor their values be valid; the database's
// still must; the result routes like the full load but cannot Build.
func TestLoadReadOnly(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "relay.yaml")
	text := `
database: {url: "${DB_URL}", schema: shop}
relay: {lease: "${LEASE}"}
admin: {listen: "0.0.0.0:9090", token: "${ADMIN_TOKEN}"}
tracing: {otlp_endpoint: "${OTLP}"}
sinks:
  - {name: hook, type: webhook, url: "${HOOK_URL}", secret: "${HOOK_SECRET}"}
  - {name: bus, type: nats, url: "nats://x:4222"}
routes:
  - {topics: ["orders.*"], sinks: [hook, {name: bus, destination: "ev.{{.Topic}}"}]}
`
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	dbOnly := env(map[string]string{"DB_URL": "postgres://u@h/db"})
	if _, err := relayconfig.Load(path, dbOnly); err == nil || !strings.Contains(err.Error(), "is not set") {
		t.Fatalf("Load without the sinks' variables = %v, want an unset variable named", err)
	}
	f, err := relayconfig.LoadReadOnly(path, dbOnly)
	if err != nil {
		t.Fatalf("LoadReadOnly: %v", err)
	}
	if got := f.RouteSinks("orders.paid"); !reflect.DeepEqual(got, []string{"hook", "bus"}) {
		t.Fatalf("RouteSinks = %v", got)
	}
	if f.Tables().Schema != "shop" || f.DatabaseURL() != "postgres://u@h/db" {
		t.Fatalf("database section: %s %s", f.Tables().Schema, f.DatabaseURL())
	}
	want := []relayconfig.Route{{Topics: []string{"orders.*"}, Targets: []relayconfig.RouteTarget{
		{Sink: "hook", Type: "webhook"}, {Sink: "bus", Type: "nats", Destination: "ev.{{.Topic}}"}}}}
	if got := f.Routes(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Routes = %+v, want %+v", got, want)
	}
	if _, err := f.Build(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "LoadReadOnly") {
		t.Fatalf("Build of a read-only load = %v, want a refusal naming LoadReadOnly", err)
	}
	if _, err := relayconfig.LoadReadOnly(path, env(nil)); err == nil || !strings.Contains(err.Error(), "database.url") {
		t.Fatalf("LoadReadOnly without the database's variable = %v, want database.url named", err)
	}
}
