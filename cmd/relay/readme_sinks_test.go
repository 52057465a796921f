package main

import (
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/heraldhq/herald/relay/relayconfig"
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
// listed in the configuration reference's sinks[].type row and has a
// section under Sinks; every one that talks to a peer (all but stdout and
// discard) is configured in the README's main example, which
// TestREADMEConfigExample loads. A new sink type fails this test until the
// README shows it.
func TestREADMEListsEverySinkType(t *testing.T) {
	t.Parallel()
	text := readme(t)
	row := regexp.MustCompile("(?m)^\\| `sinks\\[\\]\\.type` \\|[^\\n]*$").FindString(text)
	if row == "" {
		t.Fatal("README: no sinks[].type row in the configuration reference")
	}
	var example struct {
		Sinks []struct{ Type string } `yaml:"sinks"`
	}
	if err := yaml.Unmarshal([]byte(readmeConfigExample(t, text)), &example); err != nil {
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
		if !regexp.MustCompile("(?m)^### .*`type: " + regexp.QuoteMeta(typ) + "`").MatchString(text) {
			t.Errorf("sink type %s: no section under Sinks (a heading naming `type: %s`)", typ, typ)
		}
		if typ != "stdout" && typ != "discard" && !inExample[typ] {
			t.Errorf("sink type %s: not in the README's configuration example", typ)
		}
	}
}
