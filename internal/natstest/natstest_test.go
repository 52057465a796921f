package natstest_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/natstest"
)

func publish(t *testing.T, js jetstream.JetStream, subject, data string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg := &nats.Msg{Subject: subject, Data: []byte(data), Header: nats.Header{"X-Data": {data}}}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("publishing to %s: %v", subject, err)
	}
}

func TestStreamReadsBackAndIsDeleted(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.URL(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	t.Run("use", func(t *testing.T) {
		str := natstest.Stream(t, nc)
		name = str.Name
		if len(str.Subjects) != 1 || str.Subjects[0] != str.Prefix+".>" {
			t.Fatalf("subjects %v, want [%s.>]", str.Subjects, str.Prefix)
		}
		if got := str.Messages(t); len(got) != 0 {
			t.Fatalf("new stream holds %d messages", len(got))
		}
		for _, d := range []string{"one", "two", "three"} {
			publish(t, js, str.Subject("x", d), d)
		}
		got := str.Messages(t)
		if len(got) != 3 {
			t.Fatalf("read %d messages, want 3", len(got))
		}
		for i, d := range []string{"one", "two", "three"} {
			m := got[i]
			if string(m.Data) != d || m.Subject != str.Subject("x", d) || m.Header.Get("X-Data") != d || m.Seq != uint64(i+1) {
				t.Fatalf("message %d = %+v, want %s on %s at seq %d", i, m, d, str.Subject("x", d), i+1)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("stream %s after cleanup: %v, want not found", name, err)
	}
}

func TestServerRestartKeepsPortAndFileStreams(t *testing.T) {
	t.Parallel()
	srv := natstest.StartServer(t)
	url := srv.URL()
	reconnected := make(chan struct{}, 1)
	nc := natstest.Connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	str := natstest.Stream(t, nc, func(c *jetstream.StreamConfig) { c.Storage = jetstream.FileStorage })
	publish(t, js, str.Subject("a"), "before")
	serverID := nc.ConnectedServerId()
	srv.Shutdown()
	if stillServing(strings.TrimPrefix(url, "nats://"), serverID) {
		t.Fatal("the server still accepts connections after Shutdown")
	}
	srv.Restart(t)
	if srv.URL() != url {
		t.Fatalf("URL after restart %s, want %s", srv.URL(), url)
	}
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not reconnect to the restarted server")
	}
	publish(t, js, str.Subject("a"), "after")
	got := str.Messages(t)
	if len(got) != 2 || string(got[0].Data) != "before" || string(got[1].Data) != "after" {
		t.Fatalf("stream after restart holds %+v, want before and after", got)
	}
}

// stillServing reports whether the NATS server with this id answers at
// addr. A bare successful dial is not enough: with go test running packages
// in parallel, another process may listen on the freed port, and a dial to
// a free local port can connect the socket to itself.
func stillServing(addr, serverID string) bool {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(time.Second))
	info, _ := bufio.NewReader(conn).ReadString('\n')
	return strings.HasPrefix(info, "INFO ") && strings.Contains(info, serverID)
}

// TestURLWhenNoServer runs TestURLProbe in a child process against a port
// nothing listens on: skipped locally, failed under CI=true.
func TestURLWhenNoServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "nats://" + ln.Addr().String()
	ln.Close()
	for _, ci := range []string{"", "true"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestURLProbe$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "NATSTEST_PROBE=1", "NATS_URL="+dead, "CI="+ci)
		out, err := cmd.CombinedOutput()
		switch {
		case ci == "" && (err != nil || !strings.Contains(string(out), "--- SKIP: TestURLProbe")):
			t.Fatalf("CI unset: want a skip, got %v:\n%s", err, out)
		case ci == "true" && (err == nil || !strings.Contains(string(out), "--- FAIL: TestURLProbe")):
			t.Fatalf("CI=true: want a failure, got %v:\n%s", err, out)
		}
		if !strings.Contains(string(out), "nats-server -a 127.0.0.1 -p 4222 -js") || !strings.Contains(string(out), dead) {
			t.Fatalf("the message does not say what to start:\n%s", out)
		}
	}
}

// TestURLProbe is TestURLWhenNoServer's child process.
func TestURLProbe(t *testing.T) {
	if os.Getenv("NATSTEST_PROBE") != "1" {
		t.Skip("run by TestURLWhenNoServer in a child process")
	}
	t.Logf("URL returned %s", natstest.URL(t))
}
