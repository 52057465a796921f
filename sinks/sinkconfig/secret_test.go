package sinkconfig_test

import (
	"testing"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"amqp://guest:s3cret@127.0.0.1:5672/": "amqp://[redacted]@127.0.0.1:5672/",
		"nats://tok3n@host:4222":              "nats://[redacted]@host:4222",
		"redis://127.0.0.1:6379/0":            "redis://127.0.0.1:6379/0",
		"guest:s3cret@127.0.0.1:5672":         "[redacted]@127.0.0.1:5672", // no scheme: parsed as a path
		"http://u:p%zz@host/":                 "[redacted]@host/",          // unparsable, with user information
		"127.0.0.1:4566":                      "127.0.0.1:4566",            // unparsable, without user information
	} {
		if got := sinkconfig.RedactURL(raw); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}
