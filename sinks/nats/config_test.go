package nats_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := nats.Config{URL: "nats://a:4222, tls://b:4222", URLs: []string{"wss://c:443"}, AllowSubjectPrefixes: []string{"$KV.orders.", "_INBOX."}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		cfg  nats.Config
		want string
	}{
		{"no url", nats.Config{}, "url: give url or urls"},
		{"bad scheme", nats.Config{URL: "http://a:4222"}, "url: \"http://a:4222\": the scheme must be"},
		{"no host", nats.Config{URLs: []string{"nats://a:1", "localhost:4222"}}, "urls[1]: "},
		{"empty part", nats.Config{URL: "nats://a:1,"}, "url: \"\" is not a server URL"},
		{"mode", nats.Config{URL: "nats://a:1", Mode: "stream"}, `mode: "stream" must be jetstream or core`},
		{"password alone", nats.Config{URL: "nats://a:1", Password: "pw"}, "password: requires user"},
		{"user alone", nats.Config{URL: "nats://a:1", User: "u"}, "user: requires password"},
		{"two auth methods", nats.Config{URL: "nats://a:1", Token: "t", CredentialsFile: "x.creds"}, "credentials_file, token, user/password, nkey_seed_file: give at most one"},
		{"ack_timeout", nats.Config{URL: "nats://a:1", AckTimeout: -time.Second}, "ack_timeout: -1s must not be negative"},
		{"max_pending", nats.Config{URL: "nats://a:1", MaxPending: -1}, "max_pending: -1 must not be negative"},
		{"allow not reserved", nats.Config{URL: "nats://a:1", AllowSubjectPrefixes: []string{"$KV.", "orders."}}, `allow_subject_prefixes[1]: "orders." does not start with a reserved prefix`},
		{"allow without dot", nats.Config{URL: "nats://a:1", AllowSubjectPrefixes: []string{"$KV.orders"}}, `allow_subject_prefixes[0]: "$KV.orders" must end with a dot`},
		{"allow wildcard", nats.Config{URL: "nats://a:1", AllowSubjectPrefixes: []string{"$KV.*."}}, `allow_subject_prefixes[0]: "$KV.*." must not hold white space or wildcards`},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want prefix %q", tc.name, err, tc.want)
		}
	}
}

func TestConfigErrorsRedactURLSecrets(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"http://s3cr3t@a:4222", "ftp://user:s3cr3t@a:4222", "nats://s3cr3t@a b:4222"} {
		err := nats.Config{URL: raw}.Validate()
		if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "[redacted]@") {
			t.Errorf("Validate(%q) = %v, want an error with the user information redacted", raw, err)
		}
	}
}

func TestNewChecksFiles(t *testing.T) {
	t.Parallel()
	missing := t.TempDir() + "/missing"
	for _, tc := range []struct {
		cfg  nats.Config
		want string
	}{
		{nats.Config{URL: "nats://a:1", CredentialsFile: missing}, "credentials_file: "},
		{nats.Config{URL: "nats://a:1", NKeySeedFile: missing}, "nkey_seed_file: "},
		{nats.Config{URL: "nats://a:1", TLS: sinkconfig.TLSConfig{CAFile: missing}}, "tls.ca_file: "},
		{nats.Config{URL: "nats://a:1", Mode: "x"}, "mode: "},
	} {
		if _, err := nats.New("n", tc.cfg, nil); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want prefix %q", tc.cfg, err, tc.want)
		}
	}
}

func TestConfigDoesNotPrintSecrets(t *testing.T) {
	t.Parallel()
	cfg := nats.Config{URL: "nats://a:1", User: "u", Password: "pw-s3cr3t"}
	s, err := nats.New("n", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name() != "n" {
		t.Fatalf("Name() = %q", s.Name())
	}
	for _, out := range []string{sprintAll(cfg), sprintAll(nats.Config{URL: "nats://a:1", Token: "tok-s3cr3t"})} {
		if strings.Contains(out, "s3cr3t") {
			t.Fatalf("formatted config shows a secret: %s", out)
		}
	}
}

func sprintAll(v any) string { return fmt.Sprintf("%v %+v %#v %s", v, v, v, v) }
