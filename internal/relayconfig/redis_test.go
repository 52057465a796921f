package relayconfig_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// redisConfig is a configuration with one redis sink; cases edit it.
const redisConfig = `database: {url: postgres://postgres@127.0.0.1:5432/test}
sinks:
  - name: streams
    type: redis
    url: redis://herald:${REDIS_PASSWORD}@127.0.0.1:6379/0
    max_len: 100000
    max_payload: 1048576
    timeout: 2s
    tls: {enabled: false}
routes:
  - topics: ["orders.*"]
    sinks: [{name: streams, destination: "herald:{{.Topic}}"}]
`

func TestRedisSink(t *testing.T) {
	t.Parallel()
	const password = "redis-pa55-XYZ"
	env := envOf(map[string]string{"REDIS_PASSWORD": password})
	f, err := relayconfig.Parse("relay.yaml", []byte(redisConfig), env)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	b, err := f.Build(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if len(b.Sinks) != 1 || fmt.Sprintf("%T", b.Sinks[0]) != "*redis.Sink" || b.Sinks[0].Name() != "streams" {
		t.Fatalf("built sinks %v, want one *redis.Sink named streams", b.Sinks)
	}
	for _, c := range []struct{ name, from, to, want string }{
		{"negative max_len", "max_len: 100000", "max_len: -5", "sinks[0] (streams).max_len: -5 must not be negative"},
		{"max_len not a number", "max_len: 100000", "max_len: lots", "sinks[0] (streams).max_len: expected an integer"},
		{"misspelt key", "max_len: 100000", "maxlen: 100000", "sinks[0] (streams).maxlen: unknown key"},
		{"bad timeout", "timeout: 2s", "timeout: soon", `sinks[0] (streams).timeout: invalid duration "soon"`},
		{"url scheme", "url: redis://", "url: http://", "sinks[0] (streams).url: \"http://[redacted]@127.0.0.1:6379/0\": the scheme must be redis, rediss or unix"},
		{"url database", "6379/0", "6379/zero", "sinks[0] (streams).url: "},
		{"no url", "    url: redis://herald:${REDIS_PASSWORD}@127.0.0.1:6379/0\n", "", "sinks[0] (streams).url: required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(redisConfig, c.from) {
				t.Fatalf("%q is not in the configuration", c.from)
			}
			_, err := relayconfig.Parse("relay.yaml", []byte(strings.Replace(redisConfig, c.from, c.to, 1)), env)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse = %v, want an error containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), password) {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}
