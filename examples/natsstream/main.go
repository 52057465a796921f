// Command natsstream creates (or updates) the JetStream stream a Herald NATS
// sink publishes into, in one step and without the nats CLI:
//
//	go run ./examples/natsstream --server nats://localhost:4222 --stream EVENTS --subjects 'events.>'
//
// In jetstream mode every subject the relay publishes to must be covered by
// a stream; the sink pauses, naming the subject, until one is. The stream
// keeps its messages on disk (file storage) with JetStream's defaults
// otherwise, among them the two-minute duplicate window in which
// Nats-Msg-Id, the event id, drops re-published events. Running it again
// with the same name updates the stream's subjects.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "natsstream:", err)
		var usage usageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a mistake in the command line (exit status 2).
type usageError struct{ error }

// run parses args and creates or updates the stream they describe.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("natsstream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defaultServer := getenv("NATS_URL")
	if defaultServer == "" {
		defaultServer = nats.DefaultURL
	}
	server := fs.String("server", defaultServer, "NATS server URL (default $NATS_URL, else "+nats.DefaultURL+")")
	stream := fs.String("stream", "EVENTS", "stream name")
	subjects := fs.String("subjects", "events.>", "comma-separated subjects the stream covers, wildcards allowed")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the server")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	var subjectList []string
	for s := range strings.SplitSeq(*subjects, ",") {
		if s = strings.TrimSpace(s); s != "" {
			subjectList = append(subjectList, s)
		}
	}
	if len(subjectList) == 0 {
		return usageError{errors.New("--subjects: none given")}
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	nc, err := nats.Connect(*server, nats.Timeout(*timeout))
	if err != nil {
		return fmt.Errorf("--server: connecting to %s: %w", *server, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("--server %s: %w", *server, err)
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     *stream,
		Subjects: subjectList,
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("--stream %s: creating the stream on %s: %w", *stream, strings.Join(subjectList, ", "), err)
	}
	cfg := s.CachedInfo().Config
	fmt.Fprintf(stdout, "stream %s covers %s (%s storage, duplicate window %s)\n",
		cfg.Name, strings.Join(cfg.Subjects, ", "), strings.ToLower(cfg.Storage.String()), cfg.Duplicates)
	return nil
}
