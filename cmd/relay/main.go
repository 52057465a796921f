// Command relay runs Herald: it migrates the outbox schema and relays outbox
// events to the configured sinks.
//
//	relay migrate up --config relay.yaml
//	relay run --config relay.yaml
//
// Exit status: 0 on success, 1 when something failed at run time (database,
// sinks), 2 for a usage or configuration error.
package main

import (
	"errors"
	"fmt"
	"os"
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

func main() {
	os.Exit(execute(os.Args[1:]))
}

// execute runs the command line and returns the exit status. Errors cobra
// reports itself (unknown command or flag, bad arguments) are usage errors.
func execute(args []string) int {
	root := newRootCommand()
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
