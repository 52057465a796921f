package relayconfig_test

import (
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// FuzzLoad checks that no input makes the loader panic, and that every
// refusal says something. Seeds: testdata/fuzz/FuzzLoad and the cases below.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(valid))
	f.Add([]byte("database: {url: postgres://u:${PW}@h/d}\nsinks: [{name: a, type: stdout}]\nroutes: [{topics: ['*'], sinks: [a]}]\n"))
	f.Add([]byte("relay: {lease: ${LEASE:-1s}, batch_size: ${N}}\n"))
	f.Add([]byte("routes: [{topics: [x], sinks: [{name: a, destination: '{{.Topic'}]}]\n"))
	f.Add([]byte("a: &x [*x]\n"))
	env := func(name string) (string, bool) {
		switch name {
		case "PW":
			return "p@ss:w/rd", true
		case "N":
			return "12", true
		case "INJECT":
			return "}\n- ${PW}", true
		}
		return "", false
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := relayconfig.Parse("fuzz.yaml", data, env)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if err := file.Tables().Validate(); err != nil {
			t.Fatalf("accepted a file with invalid tables: %v", err)
		}
		if len(file.SinkNames()) == 0 {
			t.Fatal("accepted a file without sinks")
		}
	})
}
