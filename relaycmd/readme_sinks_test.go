package relaycmd

import (
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// sinkTypes returns the sink types the configuration loader knows, as it
// tells a user who names an unknown one.
func sinkTypes(t *testing.T) []string {
	t.Helper()
	_, err := relayconfig.Parse("unknown type", []byte("database: {url: postgres://localhost/x}\nsinks:\n  - {name: s, type: no-such-type}\nroutes:\n  - {topics: [\"*\"], sinks: [s]}\n"),
		func(string) (string, bool) { return "", false })
	if err == nil {
		t.Fatal("a sink of type no-such-type loaded")
	}
	m := regexp.MustCompile(`\(known: ([^)]*)\)`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("the unknown-type error lists no known types: %v", err)
	}
	return strings.Split(m[1], ", ")
}

// TestREADMEListsEverySinkType: every sink type the relay accepts is
// listed in the sinks[].type row of docs/configuration.md and has a
// section in docs/sinks.md; every one that talks to a peer (all but
// stdout and discard) is configured in the configuration example, which
// TestREADMEConfigExample loads. A new sink type fails this test until the
// docs show it.
func TestREADMEListsEverySinkType(t *testing.T) {
	t.Parallel()
	text := doc(t, "configuration.md")
	row := regexp.MustCompile("(?m)^\\| `sinks\\[\\]\\.type` \\|[^\\n]*$").FindString(text)
	if row == "" {
		t.Fatal("docs/configuration.md: no sinks[].type row in the key table")
	}
	sinksPage := doc(t, "sinks.md")
	var example struct {
		Sinks []struct{ Type string } `yaml:"sinks"`
	}
	if err := yaml.Unmarshal([]byte(configExample(t)), &example); err != nil {
		t.Fatal(err)
	}
	inExample := map[string]bool{}
	for _, s := range example.Sinks {
		inExample[s.Type] = true
	}
	for _, typ := range sinkTypes(t) {
		if !strings.Contains(row, "`"+typ+"`") {
			t.Errorf("sink type %s: missing from the sinks[].type row: %s", typ, row)
		}
		if !regexp.MustCompile("(?m)^## .*`type: " + regexp.QuoteMeta(typ) + "`").MatchString(sinksPage) {
			t.Errorf("sink type %s: no section in docs/sinks.md (a heading naming `type: %s`)", typ, typ)
		}
		if typ != "stdout" && typ != "discard" && !inExample[typ] {
			t.Errorf("sink type %s: not in docs/configuration.md's configuration example", typ)
		}
	}
}
