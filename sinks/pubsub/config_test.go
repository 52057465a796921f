package pubsub_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks/pubsub"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key := filepath.Join(dir, "sa.json")
	const privateKey = "-----BEGIN PRIVATE KEY-----secret-----END PRIVATE KEY-----"
	if err := os.WriteFile(key, []byte(`{"type":"service_account","private_key":"`+privateKey+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	odd := filepath.Join(dir, "odd.json")
	if err := os.WriteFile(odd, []byte(`{"type":"api_key","private_key":"`+privateKey+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	notJSON := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(notJSON, []byte(privateKey), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []pubsub.Config{
		{Project: "acme-prod"},
		{Project: "acme-prod", Endpoint: "127.0.0.1:8085", Timeout: time.Second, MaxTopics: 5},
		{Project: "acme-prod", CredentialsFile: key},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", ok, err)
		}
	}
	for _, tc := range []struct {
		name string
		cfg  pubsub.Config
		want string
	}{
		{"no project", pubsub.Config{}, "project: required"},
		{"project path", pubsub.Config{Project: "projects/acme"}, `project: "projects/acme" is not a project id`},
		{"endpoint without port", pubsub.Config{Project: "p", Endpoint: "localhost"}, `endpoint: "localhost" is not host:port`},
		{"credentials with endpoint", pubsub.Config{Project: "p", Endpoint: "127.0.0.1:8085", CredentialsFile: key}, "credentials_file: not used with endpoint"},
		{"credentials missing", pubsub.Config{Project: "p", CredentialsFile: filepath.Join(dir, "none.json")}, "credentials_file: open "},
		{"credentials not JSON", pubsub.Config{Project: "p", CredentialsFile: notJSON}, "credentials_file: " + notJSON + " is not a JSON credentials file"},
		{"credentials of an odd type", pubsub.Config{Project: "p", CredentialsFile: odd}, `credentials of type "api_key" are not supported`},
		{"negative timeout", pubsub.Config{Project: "p", Timeout: -time.Second}, "timeout: -1s must not be negative"},
		{"negative max_topics", pubsub.Config{Project: "p", MaxTopics: -1}, "max_topics: -1 must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("Validate quotes the credentials file: %v", err)
			}
			if _, err := pubsub.New("ps", tc.cfg, nil); err == nil {
				t.Fatalf("New accepted the configuration Validate refuses")
			}
		})
	}
}
