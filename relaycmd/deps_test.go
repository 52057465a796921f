package relaycmd

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// forbiddenDeps are import path prefixes the production binary must not
// link: test servers (a Kafka broker, a NATS server, an SMTP server, the
// Pub/Sub fake pstest), the Docker client and testcontainers that start
// PostgreSQL for tests, test assertion libraries, logrus (which only those
// bring in), and Herald's own test helpers and examples. github.com/emersion/go-smtp is not listed: its
// one package holds both the client the email sink uses and the server the
// tests use, so a package list cannot tell them apart; the linker keeps only
// the client, and internal/smtptest, which starts the server, is listed.
var forbiddenDeps = []string{
	"github.com/twmb/franz-go/pkg/kfake",
	"github.com/nats-io/nats-server",
	"github.com/testcontainers",
	"github.com/docker",
	"github.com/moby",
	"github.com/stretchr/testify",
	"github.com/sirupsen/logrus",
	"go.uber.org/goleak",
	"github.com/heraldhq/herald/internal/pgtest",
	"github.com/heraldhq/herald/internal/smtptest",
	"github.com/heraldhq/herald/internal/natstest",
	"github.com/heraldhq/herald/internal/redistest",
	"github.com/heraldhq/herald/internal/mysqltest",
	"github.com/heraldhq/herald/internal/mqtttest",
	"github.com/heraldhq/herald/internal/rabbitmqtest",
	"cloud.google.com/go/pubsub/v2/pstest",
	"github.com/heraldhq/herald/internal/awstest",
	"github.com/heraldhq/herald/sinks/sinktest",
	"github.com/heraldhq/herald/examples",
	"github.com/heraldhq/herald/internal/cmd",
}

// allowedDeps are exceptions to forbiddenDeps, each with its reason.
var allowedDeps = map[string]string{
	// A parser for sizes such as "64MB" (internal/relayconfig), one package
	// with no dependencies: not the Docker client.
	"github.com/docker/go-units": "relayconfig's size parser",
}

// TestBinaryCarriesNoTestServers lists what `relay` links (go list -deps,
// which leaves out test files) and fails naming every forbidden package.
func TestBinaryCarriesNoTestServers(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/heraldhq/herald/cmd/relay").Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/relay: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 || !slices.Contains(deps, "github.com/heraldhq/herald/relay") {
		t.Fatalf("go list -deps gave %d packages, without the relay library: not the list of the binary's packages", len(deps))
	}
	var found []string
	for _, dep := range deps {
		for _, prefix := range forbiddenDeps {
			if _, ok := allowedDeps[dep]; ok {
				continue
			}
			if dep == prefix || strings.HasPrefix(dep, prefix+"/") {
				found = append(found, dep+" (forbidden: "+prefix+")")
			}
		}
	}
	if len(found) > 0 {
		t.Fatalf("relay links %d packages a production binary must not carry:\n  %s", len(found), strings.Join(found, "\n  "))
	}
}
