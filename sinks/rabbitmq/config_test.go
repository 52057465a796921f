package rabbitmq_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks/rabbitmq"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/"}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	cases := []struct {
		name  string
		edit  func(*rabbitmq.Config)
		field string
	}{
		{"no url", func(c *rabbitmq.Config) { c.URL = "" }, "url:"},
		{"not a URL", func(c *rabbitmq.Config) { c.URL = "guest:s3cret@rabbit" }, "url:"},
		{"wrong scheme", func(c *rabbitmq.Config) { c.URL = "http://guest:s3cret@rabbit:5672/" }, "url:"},
		{"long exchange", func(c *rabbitmq.Config) { c.Exchange = strings.Repeat("x", 256) }, "exchange:"},
		{"negative confirm_timeout", func(c *rabbitmq.Config) { c.ConfirmTimeout = -time.Second }, "confirm_timeout:"},
		{"negative max_pending", func(c *rabbitmq.Config) { c.MaxPending = -1 }, "max_pending:"},
		{"negative max_message_size", func(c *rabbitmq.Config) { c.MaxMessageSize = -1 }, "max_message_size:"},
		{"missing CA file", func(c *rabbitmq.Config) { c.TLS = sinkconfig.TLSConfig{CAFile: "/nonexistent/ca.pem"} }, "tls.ca_file:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.HasPrefix(err.Error(), c.field) {
				t.Fatalf("Validate: %v, want an error starting %q", err, c.field)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("error %q shows the password", err)
			}
			if _, err := rabbitmq.New("x", cfg, quiet); err == nil {
				t.Fatal("New accepted the invalid config")
			}
		})
	}
}

func TestURLIsRedactedWhenPrinted(t *testing.T) {
	t.Parallel()
	cfg := rabbitmq.Config{URL: "amqp://guest:s3cret@127.0.0.1:5672/"}
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg)} {
		if strings.Contains(s, "s3cret") {
			t.Fatalf("printed config %q shows the password", s)
		}
	}
}
