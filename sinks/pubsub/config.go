package pubsub

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/api/option"

	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Format is how an event becomes a message.
type Format string

const (
	// FormatHerald is the message described in the package documentation:
	// the payload as data, herald-id, herald-topic, content-type and the
	// event's headers as attributes. The default.
	FormatHerald Format = "herald"
	// FormatCloudEvents is a CloudEvent per the Google Cloud Pub/Sub
	// protocol binding for CloudEvents, in the content mode
	// cloudevents.mode selects.
	FormatCloudEvents Format = "cloudevents"
)

// Defaults of the optional settings.
const (
	// DefaultTimeout is the default Timeout.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxTopics is the default MaxTopics.
	DefaultMaxTopics = 100
)

// Config is a Pub/Sub sink's entry in the YAML `sinks:` list (without
// `name` and `type`).
type Config struct {
	// Project is the Google Cloud project id the topics belong to.
	// Required.
	Project string `yaml:"project"`
	// Endpoint is host:port of a Pub/Sub emulator (or pstest). With it the
	// sink connects in plaintext and sends no credentials, the emulator
	// convention. Defaults to "", Google's endpoint over TLS with
	// credentials.
	Endpoint string `yaml:"endpoint"`
	// CredentialsFile is a JSON credentials file (a service account key,
	// an authorized user, an external account). Defaults to "", the
	// Application Default Credentials of the environment
	// (GOOGLE_APPLICATION_CREDENTIALS, the metadata server…). Not allowed
	// with Endpoint.
	CredentialsFile string `yaml:"credentials_file"`
	// Timeout bounds the publishing of each bundle of messages, the
	// client's own retries of transient errors included, on top of the
	// deadline of the Publish context. Defaults to 10s.
	Timeout time.Duration `yaml:"timeout"`
	// MaxTopics is the most topics the sink keeps a publisher for (each
	// has its own goroutines and buffers); the least recently used idle
	// one is stopped beyond it. Defaults to 100.
	MaxTopics int `yaml:"max_topics"`
	// Format is herald or cloudevents. Defaults to herald.
	Format Format `yaml:"format"`
	// CloudEvents sets the CloudEvents source and content mode; source is
	// required when Format is cloudevents, and the block is refused with
	// any other format.
	CloudEvents cloudevents.Config `yaml:"cloudevents"`
}

// Validate reports the first configuration problem, naming the key.
func (c Config) Validate() error {
	if c.Project == "" {
		return errors.New("project: required (the Google Cloud project id of the topics)")
	}
	if strings.ContainsAny(c.Project, "/ ") {
		return fmt.Errorf("project: %q is not a project id (no slashes or spaces)", c.Project)
	}
	if c.Endpoint != "" {
		if _, _, err := net.SplitHostPort(c.Endpoint); err != nil {
			return fmt.Errorf("endpoint: %q is not host:port (for example 127.0.0.1:8085): %w", c.Endpoint, err)
		}
		if c.CredentialsFile != "" {
			return errors.New("credentials_file: not used with endpoint (an emulator takes no credentials)")
		}
	}
	if c.CredentialsFile != "" {
		if _, err := credentialsType(c.CredentialsFile); err != nil {
			return fmt.Errorf("credentials_file: %w", err)
		}
	}
	if err := cmp.Or(
		sinkconfig.NotNegative("timeout", c.Timeout),
		sinkconfig.NotNegative("max_topics", c.MaxTopics),
	); err != nil {
		return err
	}
	if err := c.CloudEvents.ValidateFormat(string(c.Format)); err != nil {
		return err
	}
	return nil
}

// WithDefaults returns c with the defaults of unset fields filled in.
func (c Config) WithDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxTopics = cmp.Or(c.MaxTopics, DefaultMaxTopics)
	return c
}

// credentialsType reads the type of a JSON credentials file, which the
// client library needs to be told (it refuses to guess, so that a file of
// an unexpected type cannot make it fetch tokens from elsewhere). The
// error never quotes the file's content: it holds a private key.
func credentialsType(path string) (option.CredentialsType, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var f struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return "", fmt.Errorf("%s is not a JSON credentials file", path)
	}
	switch t := option.CredentialsType(f.Type); t {
	case option.ServiceAccount, option.AuthorizedUser, option.ExternalAccount, option.ImpersonatedServiceAccount:
		return t, nil
	default:
		return "", fmt.Errorf("%s: credentials of type %q are not supported (service_account, authorized_user, external_account, impersonated_service_account)", path, f.Type)
	}
}

// checkTopicID reports whether id is a valid Pub/Sub topic id: 3 to 255
// characters, starting with a letter, of letters, digits and - _ . ~ + %,
// not starting with "goog".
func checkTopicID(id string) error {
	switch {
	case len(id) < 3 || len(id) > 255:
		return fmt.Errorf("topic id %.60q is %d characters: Pub/Sub allows 3 to 255", id, len(id))
	case !isLetter(id[0]):
		return fmt.Errorf("topic id %.60q must start with a letter", id)
	case strings.HasPrefix(id, "goog"):
		return fmt.Errorf("topic id %.60q must not start with \"goog\"", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !isLetter(c) && !('0' <= c && c <= '9') && !strings.ContainsRune("-_.~+%", rune(c)) {
			return fmt.Errorf("topic id %.60q: character %q is not allowed (letters, digits and - _ . ~ + %% only)", id, c)
		}
	}
	return nil
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
