// Package awssink is what the sqs and sns sinks share: the sink itself
// (Sink), which leaves to a Service what differs between the services; the
// connection settings (region, endpoint, credentials, TLS, timeout) and the
// AWS client configuration built from them; the message encoding; the
// split of a batch into requests the services accept; and the
// classification of AWS errors.
package awssink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Defaults of the optional settings.
const (
	// DefaultTimeout is the default Config.Timeout.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxInFlight is the default Config.MaxInFlight.
	DefaultMaxInFlight = 8
)

// Config is the connection part of an sqs or sns sink's entry, inlined in
// each sink's Config.
type Config struct {
	// Region is the AWS region (us-east-1…). Required unless AWS_REGION or
	// AWS_DEFAULT_REGION is set.
	Region string `yaml:"region"`
	// Endpoint overrides the service endpoint (an emulator such as
	// LocalStack or moto: http://127.0.0.1:4566). Defaults to AWS's.
	Endpoint string `yaml:"endpoint"`
	// AccessKeyID and SecretAccessKey (and SessionToken for temporary
	// credentials) are static credentials. Give both or neither: without
	// them the AWS default chain applies (environment, shared files, web
	// identity, the instance or task role).
	AccessKeyID     string            `yaml:"access_key_id"`
	SecretAccessKey sinkconfig.Secret `yaml:"secret_access_key"`
	SessionToken    sinkconfig.Secret `yaml:"session_token"`
	// TLS configures TLS towards the endpoint (a private CA, a client
	// certificate). Defaults to the system roots.
	TLS sinkconfig.TLSConfig `yaml:"tls"`
	// Timeout bounds each Publish and Check, on top of their context's
	// deadline. Defaults to 10s.
	Timeout time.Duration `yaml:"timeout"`
	// MaxInFlight is the most batch requests of ten the sink has in
	// flight at once, over all its Publish calls; requests wait for the
	// earlier ones holding events of their keys whatever this says.
	// Defaults to 8.
	MaxInFlight int `yaml:"max_in_flight"`
}

// Validate reports the first configuration problem, naming the key.
func (c Config) Validate() error {
	if c.Region == "" && os.Getenv("AWS_REGION") == "" && os.Getenv("AWS_DEFAULT_REGION") == "" {
		return errors.New("region: required (for example us-east-1) unless AWS_REGION is set")
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("endpoint: %q is not an http:// or https:// URL", sinkconfig.RedactURL(c.Endpoint))
		}
		if u.User != nil {
			return fmt.Errorf("endpoint: %q must not hold credentials: use access_key_id and secret_access_key", sinkconfig.RedactURL(c.Endpoint))
		}
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return errors.New("access_key_id and secret_access_key: give both or neither")
	}
	if c.SessionToken != "" && c.AccessKeyID == "" {
		return errors.New("session_token: needs access_key_id and secret_access_key")
	}
	if err := cmp.Or(
		sinkconfig.NotNegative("timeout", c.Timeout),
		sinkconfig.NotNegative("max_in_flight", c.MaxInFlight),
	); err != nil {
		return err
	}
	if _, err := c.TLS.Build("tls"); err != nil {
		return err
	}
	return nil
}

// WithDefaults returns c with the defaults of unset fields filled in.
func (c Config) WithDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	return c
}

// Shown returns the endpoint for errors and logs: the configured one, or
// the region's when there is none.
func (c Config) Shown() string {
	if c.Endpoint != "" {
		return sinkconfig.RedactURL(c.Endpoint)
	}
	return "AWS region " + c.Region
}

// Load returns the AWS client configuration of c (validated, defaults
// filled). The SDK's own retries are off: a retried batch whose first reply
// was lost would send its messages twice, and the relay retries with its
// own backoff, counting attempts.
func (c Config) Load(ctx context.Context) (aws.Config, error) {
	opts := []func(*config.LoadOptions) error{
		config.WithRetryMaxAttempts(1),
	}
	if c.Region != "" {
		opts = append(opts, config.WithRegion(c.Region))
	}
	if c.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(
			c.AccessKeyID, c.SecretAccessKey.Reveal(), c.SessionToken.Reveal())))
	}
	tlsCfg, err := c.TLS.Build("tls")
	if err != nil {
		return aws.Config{}, err
	}
	opts = append(opts, config.WithHTTPClient(awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		if tlsCfg != nil {
			t.TLSClientConfig = tlsCfg
		}
		// One connection per concurrent request is kept: the relay's
		// workers publish in parallel.
		t.MaxIdleConnsPerHost = 64
	})))
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("loading AWS configuration: %w", err)
	}
	if c.Endpoint != "" {
		cfg.BaseEndpoint = aws.String(c.Endpoint)
	}
	return cfg, nil
}
