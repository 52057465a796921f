// Package relaycmd is Herald's relay command line (migrate, run, status,
// dlq, queue, config check, bench, version) as a library, so that a program
// of a few lines builds a relay binary with sinks of its own:
//
//	func main() {
//		relaycmd.Main(relaycmd.WithSink("mysink", mysink.New))
//	}
//
// where mysink.New has the signature of the built-in sinks' constructors,
// func(name string, cfg Config, logger *slog.Logger) (*Sink, error), and
// Config's yaml-tagged fields are the keys a sink entry of type mysink
// takes in the configuration file. cmd/relay is Main with no sink added.
//
// Exit status: 0 on success, 1 when something failed at run time (database,
// sinks), 2 for a usage or configuration error.
package relaycmd

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/sinks"
)

// Exit statuses.
const (
	exitRuntime = 1
	exitUsage   = 2
)

// exitError carries the exit status of a failed command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError marks a usage or configuration error (exit status 2).
func usageError(err error) error { return &exitError{code: exitUsage, err: err} }

// runtimeError marks a failure at run time (exit status 1).
func runtimeError(err error) error { return &exitError{code: exitRuntime, err: err} }

// Main runs the command line of os.Args and exits the process with its
// status.
func Main(opts ...Option) {
	o := &options{}
	for _, opt := range opts {
		opt(o)
	}
	os.Exit(execute(os.Args[1:], o))
}

// Option adds to the command line Main runs.
type Option func(*options)

// options are what Main's Options set.
type options struct {
	// version is reported by relay version and the metrics; empty means
	// the one Go recorded in the binary.
	version string
	// sinkTypes are the sink types added to the built-in ones.
	sinkTypes map[string]relayconfig.SinkType
	// err is the first invalid option, reported as a usage error.
	err error
}

// WithVersion sets the version the binary reports (relay version, the
// herald_build_info metric), typically from -ldflags "-X main.version=…".
// Empty, the default, means the module version or commit Go recorded.
func WithVersion(version string) Option {
	return func(o *options) { o.version = version }
}

// WithSink adds a sink type: a sink entry of the configuration file whose
// type is typ has its other keys decoded into a C (by its yaml tags,
// strictly: an unknown key is an error naming it, and ${NAME} references
// are expanded as for the built-in sinks), checked with C's Validate when
// the file is loaded (relay config check reports its errors), and given to
// newSink with the entry's name when the relay starts. typ must not be the
// name of a built-in type.
func WithSink[C interface{ Validate() error }, S sinks.Sink](typ string, newSink func(name string, cfg C, logger *slog.Logger) (S, error)) Option {
	return func(o *options) {
		if _, dup := o.sinkTypes[typ]; dup && o.err == nil {
			o.err = fmt.Errorf("relaycmd.WithSink: sink type %s added twice", typ)
		}
		if o.sinkTypes == nil {
			o.sinkTypes = map[string]relayconfig.SinkType{}
		}
		o.sinkTypes[typ] = relayconfig.SinkTypeOf(newSink)
	}
}

// execute runs the command line and returns the exit status. Errors cobra
// reports itself (unknown command or flag, bad arguments) are usage errors.
func execute(args []string, o *options) int {
	if o.err != nil {
		fmt.Fprintln(os.Stderr, "relay:", o.err)
		return exitUsage
	}
	root := newRootCommand(o)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "relay:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitUsage
}
