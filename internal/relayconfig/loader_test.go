package relayconfig

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/heraldhq/herald/sinks"
)

// customConfig is the settings of a sink type a Loader adds.
type customConfig struct {
	Dir string `yaml:"dir"`
}

func (c customConfig) Validate() error {
	if c.Dir == "" {
		return errors.New("dir: required")
	}
	return nil
}

func newCustom(name string, c customConfig, _ *slog.Logger) (*sinks.Discard, error) {
	return sinks.NewDiscard(name + ":" + c.Dir), nil
}

func customFile(sinkKeys string) []byte {
	return []byte("database: {url: postgres://localhost/x}\nsinks:\n  - {name: s, type: custom" + sinkKeys + "}\nroutes:\n  - {topics: [\"*\"], sinks: [s]}\n")
}

// TestLoaderAddsSinkTypes: a Loader's sink type is decoded strictly,
// validated under the entry's path and built with its settings; the
// package's Parse does not know it, and a Loader may not replace a built-in
// type.
func TestLoaderAddsSinkTypes(t *testing.T) {
	t.Parallel()
	noEnv := func(string) (string, bool) { return "", false }
	l := Loader{SinkTypes: map[string]SinkType{"custom": SinkTypeOf(newCustom)}}

	f, err := l.Parse("custom", customFile(", dir: /data"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	built, err := f.Build(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer built.Close(context.Background())
	if got := built.Config.Routes[0].Targets[0].Sink.Name(); got != "s:/data" {
		t.Fatalf("the custom sink was built as %q, want s:/data", got)
	}

	for keys, want := range map[string]string{
		"":                         "sinks[0] (s).dir: required",
		", dir: /d, directory: /d": "directory",
	} {
		if _, err := l.Parse("custom", customFile(keys), noEnv); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse with %q: %v, want an error with %q", keys, err, want)
		}
	}
	if _, err := Parse("custom", customFile(", dir: /data"), noEnv); err == nil || !strings.Contains(err.Error(), "unknown sink type") {
		t.Errorf("Parse without the Loader: %v, want unknown sink type", err)
	}
	clash := Loader{SinkTypes: map[string]SinkType{"kafka": SinkTypeOf(newCustom)}}
	if _, err := clash.Parse("clash", customFile(", dir: /data"), noEnv); err == nil || !strings.Contains(err.Error(), "built-in") {
		t.Errorf("a Loader replacing kafka: %v, want an error", err)
	}
}
