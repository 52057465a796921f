package outbox_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestApplicationDependencies keeps what an application that imports only
// outbox builds to PostgreSQL, UUIDs and the OpenTelemetry API: a package of
// this module that outbox starts to import (relay, a sink…) would bring
// brokers, Docker clients or the CLI into every application's build.
// See docs/architecture.md, "The application's dependency graph".
func TestApplicationDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}|{{.ImportPath}}",
		"github.com/heraldhq/herald/outbox").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowedModules := []string{
		"github.com/heraldhq/herald",
		"github.com/jackc/pgx/v5", "github.com/jackc/puddle/v2", "github.com/jackc/pgpassfile", "github.com/jackc/pgservicefile",
		"golang.org/x/sync", "golang.org/x/text", // pgx's
		"github.com/google/uuid",
		"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/trace", "go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/log",
		"go.opentelemetry.io/auto/sdk", "github.com/go-logr/logr", "github.com/go-logr/stdr", "github.com/cespare/xxhash/v2", // the otel API's
	}
	allowedPackages := []string{"github.com/heraldhq/herald/outbox", "github.com/heraldhq/herald/migrations",
		"github.com/heraldhq/herald/migrations/mysql"} // the MySQL tables' names, no driver
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		module, pkg, _ := strings.Cut(strings.TrimSpace(line), "|")
		if module == "" {
			continue // the standard library
		}
		if !slices.Contains(allowedModules, module) {
			t.Errorf("outbox depends on module %s (package %s)", module, pkg)
		}
		if module == "github.com/heraldhq/herald" && !slices.Contains(allowedPackages, pkg) {
			t.Errorf("outbox depends on %s", pkg)
		}
	}
}

// TestApplicationTidyNeedsNoRelayWorld covers what `go mod tidy` in an
// application that imports outbox loads besides outbox itself: outbox's own
// tests. Through internal/pgtest's Docker fallback they once put
// testcontainers and 40 modules of Docker client into every such
// application's go.sum; the fallback now lives in pgtest/pgcontainer, which
// outbox's tests do not import.
func TestApplicationTidyNeedsNoRelayWorld(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{with .Module}}{{.Path}}{{end}}|{{.ImportPath}}",
		"github.com/heraldhq/herald/outbox").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/testcontainers", "github.com/docker", "github.com/moby", "github.com/containerd",
		"github.com/nats-io", "github.com/segmentio", "github.com/twmb", "github.com/spf13",
		"github.com/prometheus", "github.com/emersion",
	}
	var found []string
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		module, pkg, _ := strings.Cut(strings.TrimSpace(line), "|")
		for _, f := range forbidden {
			if module == f || strings.HasPrefix(module, f+"/") {
				found = append(found, pkg)
			}
		}
		if pkg == "github.com/heraldhq/herald/internal/pgtest/pgcontainer" {
			found = append(found, pkg)
		}
	}
	if len(found) > 0 {
		t.Fatalf("outbox's tests, which an application's go mod tidy loads, import %d packages of the relay's or the tests' world:\n  %s",
			len(found), strings.Join(slices.Compact(found), "\n  "))
	}
}
