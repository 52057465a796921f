package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/natstest"
)

// uniqueStream returns a stream name and subject prefix of this test's
// own (the server is shared), deleting the stream when the test ends.
func uniqueStream(t *testing.T, js jetstream.JetStream) (name, prefix string) {
	t.Helper()
	id := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	name, prefix = "NATSSTREAM_"+id, "natsstream_"+id
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return name, prefix
}

func TestCreatesAndUpdatesTheStream(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	name, prefix := uniqueStream(t, js)
	var out, errOut strings.Builder
	if err := run(t.Context(), []string{"--stream", name, "--subjects", prefix + ".>"}, func(k string) string {
		if k == "NATS_URL" {
			return url
		}
		return ""
	}, &out, &errOut); err != nil {
		t.Fatalf("run: %v\n%s", err, errOut.String())
	}
	if want := "stream " + name + " covers " + prefix + ".> (file storage, duplicate window 2m0s)\n"; out.String() != want {
		t.Fatalf("output %q, want %q", out.String(), want)
	}
	// Again, with a second subject: the stream is updated, not refused.
	out.Reset()
	if err := run(t.Context(), []string{"--server", url, "--stream", name, "--subjects", prefix + ".>, " + prefix + "_b.>"}, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("second run: %v\n%s", err, errOut.String())
	}
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; strings.Join(cfg.Subjects, ",") != prefix+".>,"+prefix+"_b.>" || cfg.Storage != jetstream.FileStorage {
		t.Fatalf("stream subjects %v storage %v", cfg.Subjects, cfg.Storage)
	}
}

func TestFailures(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	name, prefix := uniqueStream(t, js)
	if err := run(t.Context(), []string{"--server", url, "--stream", name, "--subjects", prefix + ".>"}, func(string) string { return "" }, new(strings.Builder), new(strings.Builder)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"no subjects", []string{"--subjects", " , "}, true, "--subjects: none given"},
		{"an argument", []string{"extra"}, true, `unexpected argument "extra"`},
		{"unknown flag", []string{"--subject", "x"}, true, "flag provided but not defined: -subject"},
		{"no server", []string{"--server", "nats://127.0.0.1:1", "--timeout", "2s"}, false, "--server: connecting to nats://127.0.0.1:1"},
		// Another stream over the same subjects: the server refuses it,
		// and the error names the stream and the subjects.
		{"overlap", []string{"--server", url, "--stream", name + "_2", "--subjects", prefix + ".>"}, false, "--stream " + name + "_2: creating the stream on " + prefix + ".>"},
	} {
		err := run(context.Background(), c.args, func(string) string { return "" }, new(strings.Builder), new(strings.Builder))
		var usage usageError
		if err == nil || !strings.Contains(err.Error(), c.want) || errors.As(err, &usage) != c.usage {
			t.Errorf("%s: error %v (usage %v), want one containing %q (usage %v)", c.name, err, errors.As(err, &usage), c.want, c.usage)
		}
	}
}
