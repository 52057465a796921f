// Package rabbitmqtest is test support for code that talks to RabbitMQ: the
// URL of the shared broker, skipping or failing when it is down.
package rabbitmqtest

import (
	"testing"

	"github.com/heraldhq/herald/internal/localpeer"
)

// DefaultURL is the shared broker's URL when RABBITMQ_URL is not set.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// URL returns the shared broker's URL: $RABBITMQ_URL, or DefaultURL. When
// no broker answers there, the test fails if CI=true and is skipped
// otherwise, with what to start.
func URL(t testing.TB) string {
	t.Helper()
	return broker.URL(t)
}

var broker = localpeer.Service{Name: "RabbitMQ broker", Env: "RABBITMQ_URL", Default: DefaultURL,
	Start: "rabbitmq-server -detached"}
