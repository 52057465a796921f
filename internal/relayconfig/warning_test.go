package relayconfig_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// inlineSecrets is a configuration holding secrets written inline (the
// database password, the admin token, a webhook signing secret and API key,
// a Kafka password given as a ${VAR:-default} default) next to secrets
// taken from the environment (a webhook header, a NATS token).
const inlineSecrets = `
database:
  url: postgres://app:Db-Pa55-inline@127.0.0.1:5432/test
admin:
  token: Admin-T0ken-inline
sinks:
  - name: hook
    type: webhook
    url: http://127.0.0.1:9/hook
    secret: whsec_aW5saW5lLXNpZ25pbmcta2V5
    headers: {X-Api-Key: Api-K3y-inline, X-Tenant: "${TENANT}"}
  - name: bus
    type: nats
    url: nats://127.0.0.1:4222
    token: "${NATS_TOKEN}"
  - name: k
    type: kafka
    brokers: [127.0.0.1:9092]
    sasl: {mechanism: PLAIN, username: u, password: "${KAFKA_PW:-Kafka-Pw-default}"}
routes:
  - topics: ["*"]
    sinks: [hook, bus, k]
`

// TestLoadWarnsAboutReadableInlineSecrets covers a configuration file that
// holds secrets written inline while group or others may read it (modes
// 0644, 0640, 0604): Load returns one warning naming the file, its mode and
// the keys of the inline secrets, never their values, nor the keys of
// secrets taken from the environment. A file only its owner reads, a file
// whose secrets all come from the environment, and a database URL without
// a password give none.
func TestLoadWarnsAboutReadableInlineSecrets(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{"TENANT": "Tenant-from-env", "NATS_TOKEN": "Nats-T0ken-env"})
	load := func(t *testing.T, text string, mode os.FileMode) []relayconfig.Warning {
		t.Helper()
		path := filepath.Join(t.TempDir(), "relay.yaml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		f, err := relayconfig.Load(path, env)
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		return f.Warnings()
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604} {
		ws := load(t, inlineSecrets, mode)
		if len(ws) != 1 {
			t.Fatalf("mode %04o: %d warnings, want 1", mode, len(ws))
		}
		var buf bytes.Buffer
		slog.New(slog.NewTextHandler(&buf, nil)).LogAttrs(context.Background(), slog.LevelWarn, ws[0].Message, ws[0].Attrs...)
		line := buf.String()
		keys := `keys="[database.url admin.token sinks[0] (hook).secret sinks[0] (hook).headers.X-Api-Key sinks[2] (k).sasl.password]"`
		for _, want := range []string{"written inline", "relay.yaml", fmt.Sprintf("mode=%04o", mode), keys} {
			if !strings.Contains(line, want) {
				t.Errorf("mode %04o: warning %q lacks %q", mode, line, want)
			}
		}
		for _, secret := range []string{"Db-Pa55", "Admin-T0ken", "aW5saW5l", "Api-K3y", "Kafka-Pw", "Tenant-from-env", "Nats-T0ken", "X-Tenant", "(bus).token"} {
			if strings.Contains(line, secret) {
				t.Errorf("mode %04o: warning shows %q: %s", mode, secret, line)
			}
		}
	}
	if ws := load(t, inlineSecrets, 0o600); len(ws) != 0 {
		t.Fatalf("mode 0600: %v, want no warning", ws)
	}
	fromEnv := strings.NewReplacer("Db-Pa55-inline", "${DB_PW}", "Admin-T0ken-inline", "${ADMIN_TOKEN}",
		"whsec_aW5saW5lLXNpZ25pbmcta2V5", "${HOOK_SECRET}", "Api-K3y-inline", `"${API_KEY}"`, ":-Kafka-Pw-default", "").Replace(inlineSecrets)
	env = envOf(map[string]string{"TENANT": "t", "NATS_TOKEN": "n", "DB_PW": "p", "ADMIN_TOKEN": "a",
		"HOOK_SECRET": "whsec_aW5saW5lLXNpZ25pbmcta2V5", "API_KEY": "k", "KAFKA_PW": "kp"})
	if ws := load(t, fromEnv, 0o644); len(ws) != 0 {
		t.Fatalf("secrets from the environment: %v, want no warning", ws)
	}
	if ws := load(t, valid, 0o644); len(ws) != 0 {
		t.Fatalf("a database URL without a password: %v, want no warning", ws)
	}
}
