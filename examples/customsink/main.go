//go:build unix

// Command customsink is Herald's relay binary with one sink type added:
// `type: file`, the example sink of examples/filesink, which appends each
// event as a JSON line to a file per destination. Everything else (the
// commands, the flags, the other sink types) is the stock relay's:
//
//	go build -o relay ./examples/customsink
//	relay migrate up --config relay.yaml
//	relay run --config relay.yaml
//
// with, in relay.yaml,
//
//	sinks:
//	  - name: files
//	    type: file
//	    dir: /var/lib/herald/events
//	routes:
//	  - topics: ["*"]
//	    sinks: [files]
package main

import (
	"errors"
	"log/slog"
	"time"

	"github.com/heraldhq/herald/examples/filesink"
	"github.com/heraldhq/herald/relaycmd"
)

// fileConfig is what a sink entry of type file takes besides its name and
// type: its yaml tags are the entry's keys.
type fileConfig struct {
	// Dir is the directory of the files; it must exist. Required.
	Dir string `yaml:"dir"`
	// MaxEventBytes is the largest payload written. Defaults to 1 MiB.
	MaxEventBytes int `yaml:"max_event_bytes"`
	// LockedRetry is how long to wait before writing again to a file
	// whose consumer holds its lock. Defaults to 5 seconds.
	LockedRetry time.Duration `yaml:"locked_retry"`
}

// Validate reports what is wrong with the entry, when the configuration is
// loaded (relay config check), before anything starts.
func (c fileConfig) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("dir: required (the directory the files are written in)"))
	}
	if c.MaxEventBytes < 0 {
		errs = append(errs, errors.New("max_event_bytes: must not be negative"))
	}
	if c.LockedRetry < 0 {
		errs = append(errs, errors.New("locked_retry: must not be negative"))
	}
	return errors.Join(errs...)
}

// newFileSink builds the sink of one entry when the relay starts.
func newFileSink(name string, c fileConfig, _ *slog.Logger) (*filesink.Sink, error) {
	return filesink.New(name, filesink.Config{Dir: c.Dir, MaxEventBytes: c.MaxEventBytes, LockedRetry: c.LockedRetry})
}

func main() {
	relaycmd.Main(relaycmd.WithSink("file", newFileSink))
}
