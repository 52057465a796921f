package redis

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Defaults of the optional settings.
const (
	// DefaultTimeout is the default Timeout.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxPayload is the default MaxPayload: Redis' default
	// proto-max-bulk-len, the largest string a server accepts.
	DefaultMaxPayload = 512 << 20
)

// Config is a Redis sink's entry in the YAML `sinks:` list (without `name`
// and `type`).
type Config struct {
	// URL is the server: redis://[user:password@]host:port/db, rediss://
	// for TLS, or unix:///path/to/socket?db=N. Required.
	URL string `yaml:"url"`
	// Username and Password authenticate (Redis 6 ACL user, or the
	// requirepass password with no username). They override those of URL.
	Username string            `yaml:"username"`
	Password sinkconfig.Secret `yaml:"password"`
	// TLS configures TLS. A rediss:// URL turns TLS on by itself.
	TLS sinkconfig.TLSConfig `yaml:"tls"`
	// MaxLen caps each stream at about this many entries: every XADD
	// carries MAXLEN ~ N, so Redis trims whole macro nodes and a stream may
	// hold somewhat more. Defaults to 0, no cap.
	MaxLen int64 `yaml:"max_len"`
	// MaxPayload is the largest payload sent; a larger event fails
	// permanently without being sent. Keep it at or below the server's
	// proto-max-bulk-len. Defaults to 536870912 (512 MiB, Redis' default).
	MaxPayload int `yaml:"max_payload"`
	// Timeout bounds each Publish and Check, on top of the deadline of
	// their context; connecting (and the TLS handshake) gets half of it.
	// Defaults to 5s.
	Timeout time.Duration `yaml:"timeout"`
}

// Validate reports the first configuration problem, naming the key.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("url: required (for example redis://127.0.0.1:6379/0)")
	}
	if _, err := c.options(); err != nil {
		return err
	}
	if err := cmp.Or(
		sinkconfig.NotNegative("max_len", c.MaxLen),
		sinkconfig.NotNegative("max_payload", c.MaxPayload),
		sinkconfig.NotNegative("timeout", c.Timeout),
	); err != nil {
		return err
	}
	if _, err := c.TLS.Build("tls"); err != nil {
		return err
	}
	return nil
}

// options parses URL into go-redis options, with errors naming the key and
// never the URL's password.
func (c Config) options() (*goredis.Options, error) {
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, fmt.Errorf("url: %q is not a URL such as redis://host:6379/0", sinkconfig.RedactURL(c.URL))
	}
	switch u.Scheme {
	case "redis", "rediss":
		if u.Host == "" {
			return nil, fmt.Errorf("url: %q names no host", sinkconfig.RedactURL(c.URL))
		}
	case "unix":
		if u.Path == "" {
			return nil, fmt.Errorf("url: %q names no socket path", sinkconfig.RedactURL(c.URL))
		}
	default:
		return nil, fmt.Errorf("url: %q: the scheme must be redis, rediss or unix", sinkconfig.RedactURL(c.URL))
	}
	opts, err := goredis.ParseURL(c.URL)
	if err != nil {
		// go-redis' messages name the offending part (db, a query
		// option), never the password.
		return nil, fmt.Errorf("url: %q: %w", sinkconfig.RedactURL(c.URL), err)
	}
	return opts, nil
}

// WithDefaults returns c with the defaults of unset fields filled in.
func (c Config) WithDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxPayload = cmp.Or(c.MaxPayload, DefaultMaxPayload)
	return c
}
