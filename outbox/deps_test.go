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
	allowedPackages := []string{"github.com/heraldhq/herald/outbox", "github.com/heraldhq/herald/migrations"}
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
