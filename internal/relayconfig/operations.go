package relayconfig

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/heraldhq/herald/relay/admin"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Admin is the admin section: the HTTP server of relay run that serves
// /healthz, /readyz, /metrics, the dead-letter API and the console.
type Admin struct {
	// Listen is the host:port to listen on; "" disables the server.
	// Defaults to 127.0.0.1:9090.
	Listen *string `yaml:"listen"`
	// Token is the bearer token the dead-letter API requires. Required when
	// listen is not a loopback address.
	Token sinkconfig.Secret `yaml:"token"`
	// ReadyPauseThreshold is how long a sink may stay paused (down) before
	// /readyz fails. Defaults to 1m.
	ReadyPauseThreshold time.Duration `yaml:"ready_pause_threshold"`
	// Console serves the web console (relay/internal/console) at /ui/ on the admin
	// server. Defaults to true.
	Console *bool `yaml:"console"`
	// ConsoleReadOnly hides the console's replay and purge buttons and
	// refuses them. Defaults to false.
	ConsoleReadOnly bool `yaml:"console_read_only"`
}

// ConsoleEnabled reports whether the admin server serves the console.
func (a Admin) ConsoleEnabled() bool { return a.Enabled() && (a.Console == nil || *a.Console) }

// Enabled reports whether the admin server should run.
func (a Admin) Enabled() bool { return a.Listen == nil || *a.Listen != "" }

// Config returns the admin server's configuration, defaults filled in.
func (a Admin) Config() admin.Config {
	c := admin.Config{Token: a.Token, ReadyPauseThreshold: a.ReadyPauseThreshold}
	if a.Listen != nil {
		c.Listen = *a.Listen
	}
	return c.WithDefaults()
}

func (a Admin) validate() error {
	if a.ConsoleReadOnly && !a.ConsoleEnabled() {
		return errors.New("admin.console_read_only: set, but the console is off (admin.console: false or no admin.listen): remove one of them")
	}
	if !a.Enabled() {
		return nil
	}
	return a.Config().Validate()
}

// Tracing is the tracing section: OpenTelemetry spans exported over OTLP.
type Tracing struct {
	// OTLPEndpoint is the OTLP/HTTP traces URL, e.g.
	// http://otel-collector:4318/v1/traces. Empty disables tracing.
	// Defaults to empty.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// SampleRatio is the fraction of new traces sampled, from 0 to 1; spans
	// continuing a producer's trace follow its sampling decision.
	// Defaults to 1.
	SampleRatio *float64 `yaml:"sample_ratio"`
}

// Enabled reports whether spans are exported.
func (t Tracing) Enabled() bool { return t.OTLPEndpoint != "" }

// Ratio returns SampleRatio, or its default.
func (t Tracing) Ratio() float64 {
	if t.SampleRatio == nil {
		return 1
	}
	return *t.SampleRatio
}

func (t Tracing) validate() error {
	if r := t.Ratio(); r < 0 || r > 1 {
		return fmt.Errorf("tracing.sample_ratio: must be from 0 to 1, got %g", r)
	}
	if t.OTLPEndpoint == "" {
		return nil
	}
	u, err := url.Parse(t.OTLPEndpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("tracing.otlp_endpoint: must be an http(s) URL such as http://otel-collector:4318/v1/traces")
	}
	return nil
}
