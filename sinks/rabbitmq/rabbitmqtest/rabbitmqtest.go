// Package rabbitmqtest is test support for code that talks to RabbitMQ: the
// URL of the shared broker, skipping or failing when it is down.
package rabbitmqtest

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultURL is the shared broker's URL when RABBITMQ_URL is not set.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// probes caches, per URL, whether a broker answered (nil) or why not.
var probes sync.Map // string → error

// URL returns the shared broker's URL: $RABBITMQ_URL, or DefaultURL. When
// no broker answers there, the test fails if CI=true and is skipped
// otherwise, with what to start.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("RABBITMQ_URL")
	if u == "" {
		u = DefaultURL
	}
	v, ok := probes.Load(u)
	if !ok {
		conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err == nil {
			conn.Close()
		}
		v, _ = probes.LoadOrStore(u, err)
	}
	if err, _ := v.(error); err != nil {
		msg := fmt.Sprintf("rabbitmqtest: no RabbitMQ broker at $RABBITMQ_URL or %s (%v); start one: rabbitmq-server -detached",
			DefaultURL, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return u
}
