package redis_test

import (
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks/redis"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []redis.Config{
		{URL: "redis://127.0.0.1:6379/0"},
		{URL: "rediss://user:pw@redis.example:6380/2", MaxLen: 1000, MaxPayload: 1 << 20, Timeout: time.Second},
		{URL: "unix:///run/redis.sock?db=1"},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", ok, err)
		}
	}
	for _, tc := range []struct {
		name string
		cfg  redis.Config
		want string
	}{
		{"no url", redis.Config{}, "url: required"},
		{"bad scheme", redis.Config{URL: "http://a:6379"}, `url: "http://a:6379": the scheme must be redis, rediss or unix`},
		{"no host", redis.Config{URL: "redis:///0"}, "url: "},
		{"bad db", redis.Config{URL: "redis://a:6379/x"}, `url: "redis://a:6379/x": redis: invalid database number`},
		{"max_len", redis.Config{URL: "redis://a:1", MaxLen: -1}, "max_len: -1 must not be negative"},
		{"max_payload", redis.Config{URL: "redis://a:1", MaxPayload: -1}, "max_payload: -1 must not be negative"},
		{"timeout", redis.Config{URL: "redis://a:1", Timeout: -time.Second}, "timeout: -1s must not be negative"},
		{"tls", redis.Config{URL: "redis://a:1", TLS: sinkconfig.TLSConfig{CAFile: "/nonexistent/ca.pem"}}, "tls.ca_file: "},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want prefix %q", tc.name, err, tc.want)
		}
	}
}

func TestConfigErrorsRedactURLPassword(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"http://user:s3cr3t@a:6379", "redis://:s3cr3t@a:6379/notadb", "redis://u:s3cr3t@a b:6379"} {
		err := redis.Config{URL: raw}.Validate()
		if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "[redacted]@") {
			t.Errorf("Validate(%q) = %v, want an error with the user information redacted", raw, err)
		}
	}
}
