package nats

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Mode selects how the sink publishes.
type Mode string

const (
	// ModeJetStream publishes to JetStream and waits for the stream's
	// acknowledgement of every message: an event is reported delivered only
	// once a stream has stored it. The default.
	ModeJetStream Mode = "jetstream"
	// ModeCore publishes with core NATS and confirms with a flush (a
	// PING/PONG round trip): the server has read the messages, but nothing
	// says a subscriber or stream received them. Weaker: use it only for
	// subjects where losing a message is acceptable.
	ModeCore Mode = "core"
)

// Format is how an event becomes a message.
type Format string

const (
	// FormatHerald is the message described in the package documentation:
	// the payload, Nats-Msg-Id, Herald-Topic, Herald-Key, Content-Type and
	// the event's headers. The default.
	FormatHerald Format = "herald"
	// FormatCloudEvents is a CloudEvent per the CloudEvents NATS protocol
	// binding, in the content mode cloudevents.mode selects.
	FormatCloudEvents Format = "cloudevents"
)

// Defaults of the optional settings.
const (
	// DefaultAckTimeout is the default AckTimeout.
	DefaultAckTimeout = 5 * time.Second
	// DefaultMaxPending is the default MaxPending.
	DefaultMaxPending = 1024
)

// Config is a NATS sink's entry in the YAML `sinks:` list (without `name`
// and `type`).
type Config struct {
	// URL is a server URL (nats://, tls://, ws:// or wss://), or several
	// separated by commas. Give URL, URLs or both; the sink connects to one
	// of them and fails over to the others.
	URL string `yaml:"url"`
	// URLs lists more server URLs, joined with those of URL.
	URLs []string `yaml:"urls"`
	// Mode is "jetstream" or "core". Defaults to jetstream.
	Mode Mode `yaml:"mode"`
	// CredentialsFile is a NATS .creds file (user JWT and NKey seed).
	CredentialsFile string `yaml:"credentials_file"`
	// Token is an authentication token.
	Token sinkconfig.Secret `yaml:"token"`
	// User and Password authenticate with a user name and password; give
	// both or neither.
	User     string            `yaml:"user"`
	Password sinkconfig.Secret `yaml:"password"`
	// NKeySeedFile is a file holding an NKey user seed.
	NKeySeedFile string `yaml:"nkey_seed_file"`
	// TLS configures TLS. A tls:// or wss:// URL turns TLS on by itself.
	TLS sinkconfig.TLSConfig `yaml:"tls"`
	// AckTimeout bounds the wait for each message's acknowledgement (the
	// stream's PubAck in JetStream mode, the flush's PONG in core mode), on
	// top of the deadline of the Publish context. Defaults to 5s.
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// MaxPending is the most JetStream messages in flight (sent, not yet
	// acknowledged) at once; a larger batch waits for the oldest
	// acknowledgements before sending more. Defaults to 1024.
	MaxPending int `yaml:"max_pending"`
	// CheckStreams makes the sink verify, in JetStream mode, that a stream
	// covers each subject before its first publish to it (results are
	// cached). Defaults to true; set it to false to skip the lookup when
	// the account may not list streams.
	CheckStreams *bool `yaml:"check_streams"`
	// AllowSubjectPrefixes lets events be published under reserved subject
	// prefixes, each named explicitly ("$KV.", or "$KV.orders." for one
	// bucket). Without it the sink refuses every destination starting with
	// $JS., $SYS., $KV., $O. or _INBOX. (see the package documentation).
	// Each entry must start with one of those prefixes and end with a dot.
	// Defaults to none.
	AllowSubjectPrefixes []string `yaml:"allow_subject_prefixes"`
	// Format is herald or cloudevents. Defaults to herald.
	Format Format `yaml:"format"`
	// CloudEvents sets the CloudEvents source and content mode; source is
	// required when Format is cloudevents, and the block is refused with
	// any other format.
	CloudEvents cloudevents.Config `yaml:"cloudevents"`
}

// reservedPrefixes start the subjects the NATS server or its clients act on
// rather than store: the JetStream API ($JS.API.STREAM.PURGE.<name> purges a
// stream), the system account, key-value and object stores, and reply
// inboxes. An event's destination comes from event data, so it may name one.
var reservedPrefixes = []string{"$JS.", "$SYS.", "$KV.", "$O.", "_INBOX."}

// checkReserved refuses subject when it starts with a reserved prefix and
// no allowed prefix covers it.
func checkReserved(subject string, allowed []string) error {
	for _, r := range reservedPrefixes {
		if !strings.HasPrefix(subject, r) {
			continue
		}
		for _, a := range allowed {
			if strings.HasPrefix(subject, a) {
				return nil
			}
		}
		return fmt.Errorf("destination %q starts with the reserved prefix %s, where the NATS server acts on messages: "+
			"not published (name the prefix in allow_subject_prefixes to publish there)", subject, r)
	}
	return nil
}

// servers returns the configured URLs, URL's comma-separated ones first,
// each paired with the key that named it (for errors).
func (c Config) servers() (urls, keys []string) {
	if c.URL != "" {
		for part := range strings.SplitSeq(c.URL, ",") {
			urls = append(urls, strings.TrimSpace(part))
			keys = append(keys, "url")
		}
	}
	for i, u := range c.URLs {
		urls = append(urls, strings.TrimSpace(u))
		keys = append(keys, fmt.Sprintf("urls[%d]", i))
	}
	return urls, keys
}

// Validate reports the first configuration problem, naming the key.
func (c Config) Validate() error {
	urls, keys := c.servers()
	if len(urls) == 0 {
		return errors.New("url: give url or urls (for example nats://127.0.0.1:4222)")
	}
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return fmt.Errorf("%s: %q is not a server URL such as nats://host:4222", keys[i], sinkconfig.RedactURL(raw))
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("%s: %q: the scheme must be nats, tls, ws or wss", keys[i], sinkconfig.RedactURL(raw))
		}
	}
	switch c.Mode {
	case "", ModeJetStream, ModeCore:
	default:
		return fmt.Errorf("mode: %q must be jetstream or core", c.Mode)
	}
	if c.Password != "" && c.User == "" {
		return errors.New("password: requires user")
	}
	if c.User != "" && c.Password == "" {
		return errors.New("user: requires password")
	}
	methods := 0
	for _, set := range []bool{c.CredentialsFile != "", c.Token != "", c.User != "", c.NKeySeedFile != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		return errors.New("credentials_file, token, user/password, nkey_seed_file: give at most one")
	}
	if err := cmp.Or(
		sinkconfig.NotNegative("ack_timeout", c.AckTimeout),
		sinkconfig.NotNegative("max_pending", c.MaxPending),
	); err != nil {
		return err
	}
	if err := c.CloudEvents.ValidateFormat(string(c.Format)); err != nil {
		return err
	}
	for i, p := range c.AllowSubjectPrefixes {
		reserved := false
		for _, r := range reservedPrefixes {
			reserved = reserved || strings.HasPrefix(p, r)
		}
		switch {
		case !reserved:
			return fmt.Errorf("allow_subject_prefixes[%d]: %q does not start with a reserved prefix (%s); other subjects need no allowing",
				i, p, strings.Join(reservedPrefixes, " "))
		case strings.ContainsAny(p, " \t\r\n*>"):
			return fmt.Errorf("allow_subject_prefixes[%d]: %q must not hold white space or wildcards", i, p)
		case !strings.HasSuffix(p, "."):
			return fmt.Errorf("allow_subject_prefixes[%d]: %q must end with a dot, so that it covers whole tokens", i, p)
		}
	}
	return nil
}

// WithDefaults returns c with the defaults of unset fields filled in.
func (c Config) WithDefaults() Config {
	c.Mode = cmp.Or(c.Mode, ModeJetStream)
	c.AckTimeout = cmp.Or(c.AckTimeout, DefaultAckTimeout)
	c.MaxPending = cmp.Or(c.MaxPending, DefaultMaxPending)
	if c.CheckStreams == nil {
		on := true
		c.CheckStreams = &on
	}
	return c
}
