package redis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/heraldhq/herald/internal/redistest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/redis"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// bundle is what most tests need: the shared server, an admin client and
// a key prefix of the test's own.
type bundle struct {
	url    string
	admin  *goredis.Client
	prefix string
}

func setup(t *testing.T) bundle {
	t.Helper()
	url := redistest.URL(t)
	admin := redistest.Client(t, url)
	return bundle{url: url, admin: admin, prefix: redistest.Prefix(t, admin)}
}

// open returns a sink with a name unique to the test, closed in cleanup.
func open(t *testing.T, cfg redis.Config) *redis.Sink {
	t.Helper()
	s, err := redis.New("test-"+uuid.NewString()[:8], cfg, nil)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("closing sink: %v", err)
		}
	})
	return s
}

func publish(t *testing.T, s sinks.Sink, events ...sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	return errs
}

func publishOK(t *testing.T, s sinks.Sink, events ...sinks.Event) {
	t.Helper()
	for i, err := range publish(t, s, events...) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
}

func ids(msgs []goredis.XMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i], _ = m.Values[redis.FieldID].(string)
	}
	return out
}

func TestConformance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			t.Cleanup(func() { b.admin.Del(context.Background(), destination) })
			return open(t, redis.Config{URL: b.url})
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			return open(t, redis.Config{URL: "redis://" + sinktest.ClosedAddr(t)})
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, m := range redistest.Entries(t, b.admin, destination) {
				str := func(f string) string { s, _ := m.Values[f].(string); return s }
				var headers map[string]string
				if err := json.Unmarshal([]byte(str(redis.FieldHeaders)), &headers); err != nil {
					t.Fatalf("entry %s: headers %q: %v", m.ID, str(redis.FieldHeaders), err)
				}
				out = append(out, sinktest.Received{ID: str(redis.FieldID), Key: str(redis.FieldKey),
					Destination: destination, Payload: []byte(str(redis.FieldPayload)), Headers: headers})
			}
			return out
		},
		// No stream name: refused before sending.
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Event("", key, []byte(`{"refused":true}`))
		},
		// The server refuses the event: its stream is a key of another
		// type (WRONGTYPE), answered inside the batch's pipeline.
		RefusedByPeer: func(t *testing.T, destination, key string) sinks.Event {
			wrong := destination + ":string"
			if err := b.admin.Set(context.Background(), wrong, "not a stream", 0).Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.admin.Del(context.Background(), wrong) })
			return sinktest.Event(wrong, key, []byte(`{"refused":true}`))
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
		Timeout:  30 * time.Second,
	})
}

// TestEntryFields reads an entry back with XRANGE as a consumer would,
// field order included.
func TestEntryFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := open(t, redis.Config{URL: b.url})
	stream := b.prefix + "orders"
	e := sinktest.Event(stream, "order-7", []byte("\x00\xffbinary"))
	e.Topic = "orders.created"
	e.ContentType = "application/octet-stream"
	e.Headers = map[string]string{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	noKey := sinktest.Event(stream, "", []byte(`{}`))
	publishOK(t, s, e, noKey)

	reply, err := b.admin.Do(context.Background(), "XRANGE", stream, "-", "+").Slice()
	if err != nil || len(reply) != 2 {
		t.Fatalf("XRANGE: %v (%d entries), want 2", err, len(reply))
	}
	fields := func(entry any) []string {
		pair := entry.([]any)
		var out []string
		for _, f := range pair[1].([]any) {
			out = append(out, f.(string))
		}
		return out
	}
	want := []string{
		"id", e.ID, "topic", "orders.created", "key", "order-7", "content_type", "application/octet-stream",
		"headers", `{"tenant":"acme","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		"payload", "\x00\xffbinary",
	}
	if got := fields(reply[0]); !slices.Equal(got, want) {
		t.Fatalf("entry fields:\n got %q\nwant %q", got, want)
	}
	wantNoKey := []string{"id", noKey.ID, "topic", stream, "key", "", "content_type", sinks.ContentTypeJSON, "headers", "{}", "payload", "{}"}
	if got := fields(reply[1]); !slices.Equal(got, wantNoKey) {
		t.Fatalf("entry without key or headers:\n got %q\nwant %q", got, wantNoKey)
	}
}

func TestMaxLenTrimsApproximately(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stream := b.prefix + "capped"
	s := open(t, redis.Config{URL: b.url, MaxLen: 10})
	const total = 1000
	for batch := 0; batch < total/250; batch++ {
		var events []sinks.Event
		for i := 0; i < 250; i++ {
			events = append(events, sinktest.Event(stream, "", []byte(`{}`)))
		}
		publishOK(t, s, events...)
	}
	n, err := b.admin.XLen(context.Background(), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	// MAXLEN ~ trims whole macro nodes (stream-node-max-entries, 100 by
	// default): the stream keeps at least 10, and far fewer than it got.
	if n < 10 || n >= total/2 {
		t.Fatalf("XLEN = %d after %d entries with max_len 10, want at least 10 and far below %d", n, total, total)
	}
	uncapped := b.prefix + "uncapped"
	s2 := open(t, redis.Config{URL: b.url})
	var events []sinks.Event
	for i := 0; i < 300; i++ {
		events = append(events, sinktest.Event(uncapped, "", []byte(`{}`)))
	}
	publishOK(t, s2, events...)
	if n, _ := b.admin.XLen(context.Background(), uncapped).Result(); n != 300 {
		t.Fatalf("without max_len XLEN = %d, want 300", n)
	}
}

// TestWrongTypeIsPermanent: a key that is not a stream refuses its events
// for good, the others of the batch are delivered, and CheckDestinations
// names the key.
func TestWrongTypeIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good, wrong, missing := b.prefix+"good", b.prefix+"a-list", b.prefix+"missing"
	if err := b.admin.LPush(context.Background(), wrong, "x").Err(); err != nil {
		t.Fatal(err)
	}
	s := open(t, redis.Config{URL: b.url})
	events := []sinks.Event{
		sinktest.Event(good, "k1", []byte(`1`)),
		sinktest.Event(wrong, "k2", []byte(`2`)),
		sinktest.Event(good, "k3", []byte(`3`)),
	}
	errs := publish(t, s, events...)
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("events to a stream: %v, %v", errs[0], errs[2])
	}
	if !sinks.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "WRONGTYPE") || !strings.Contains(errs[1].Error(), wrong) {
		t.Fatalf("event to a list: %v, want a permanent WRONGTYPE error naming %s", errs[1], wrong)
	}
	if got := ids(redistest.Entries(t, b.admin, good)); !slices.Equal(got, []string{events[0].ID, events[2].ID}) {
		t.Fatalf("stream holds %v", got)
	}
	if err := s.CheckDestinations(context.Background(), good, missing); err != nil {
		t.Fatalf("CheckDestinations(stream, missing key) = %v, want nil", err)
	}
	err := s.CheckDestinations(context.Background(), good, wrong)
	if err == nil || !strings.Contains(err.Error(), wrong) || !strings.Contains(err.Error(), "holds a list") {
		t.Fatalf("CheckDestinations(list) = %v, want an error naming %s and its type", err, wrong)
	}
}

// TestRefusedBeforeSending: an event the sink cannot send fails
// permanently, the later events of its key are skipped, other keys go.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stream := b.prefix + "s"
	s := open(t, redis.Config{URL: b.url, MaxPayload: 1024})
	events := []sinks.Event{
		sinktest.Oversized(stream, "big", 2000),
		sinktest.Event(stream, "big", []byte(`"after the big one"`)),
		sinktest.Event("", "nodest", []byte(`{}`)),
		sinktest.Event(stream, "other", []byte(`"other key"`)),
	}
	errs := publish(t, s, events...)
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "max_payload") || !strings.Contains(errs[0].Error(), "2000 bytes") {
		t.Fatalf("oversized event: %v, want permanent naming max_payload and the size", errs[0])
	}
	if !errors.Is(errs[1], sinks.ErrSkipped) {
		t.Fatalf("later event of the refused key: %v, want ErrSkipped", errs[1])
	}
	if !sinks.IsPermanent(errs[2]) || !strings.Contains(errs[2].Error(), "destination is empty") {
		t.Fatalf("event without destination: %v, want permanent", errs[2])
	}
	if errs[3] != nil {
		t.Fatalf("event of another key: %v", errs[3])
	}
	if got := ids(redistest.Entries(t, b.admin, stream)); !slices.Equal(got, []string{events[3].ID}) {
		t.Fatalf("stream holds %v, want only %s", got, events[3].ID)
	}
}

func TestConnectionRefusedIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s := open(t, redis.Config{URL: "redis://herald:s3cr3t@" + addr + "/0", Timeout: 2 * time.Second})
	errs := publish(t, s, sinktest.Event("herald_test:x", "", []byte(`{}`)), sinktest.Event("herald_test:x", "", []byte(`{}`)))
	for i, err := range errs {
		if !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("event %d: %v, want Unavailable (connection refused)", i, err)
		}
	}
	err = s.Check(context.Background())
	if !sinks.IsUnavailable(err) || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "[redacted]@"+addr) {
		t.Fatalf("Check = %v, want Unavailable naming the server with its password redacted", err)
	}
}

// TestBadAuthIsUnavailable: the shared server has no such user, so it
// answers WRONGPASS, as it does for a wrong password.
func TestBadAuthIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("herald-nosuchuser-"+uuid.NewString()[:8], "s3cr3t")
	for _, cfg := range []redis.Config{
		{URL: u.String()},
		{URL: b.url, Username: u.User.Username(), Password: "s3cr3t"},
	} {
		s := open(t, cfg)
		errs := publish(t, s, sinktest.Event(b.prefix+"x", "", []byte(`{}`)))
		if !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), "WRONGPASS") || strings.Contains(errs[0].Error(), "s3cr3t") {
			t.Fatalf("publish: %v, want Unavailable WRONGPASS without the password", errs[0])
		}
		if err := s.Check(context.Background()); !sinks.IsUnavailable(err) || strings.Contains(err.Error(), "s3cr3t") {
			t.Fatalf("Check = %v, want Unavailable without the password", err)
		}
	}
	if n, _ := b.admin.Exists(context.Background(), b.prefix+"x").Result(); n != 0 {
		t.Fatal("the stream was created although authentication failed")
	}
}

// stallProxy forwards TCP connections to a server; once stalled, it drops
// the server's replies, so a client waits for answers that never come
// while the server did run its commands.
type stallProxy struct {
	ln      net.Listener
	target  string
	stalled atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *stallProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		go io.Copy(server, client)
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && !p.stalled.Load() {
					if _, werr := client.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					client.Close()
					return
				}
			}
		}()
	}
}

// TestNoReplyIsRetryable: a batch the server received but did not answer
// in time fails retryable (neither permanent nor Unavailable), whether
// the context's deadline or the sink's timeout ran out first.
func TestNoReplyIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u, _ := url.Parse(b.url)
	proxy := startStallProxy(t, u.Host)
	stream := b.prefix + "stalled"
	for _, tc := range []struct {
		name       string
		timeout    time.Duration
		ctxTimeout time.Duration
	}{
		{"context deadline", 30 * time.Second, 500 * time.Millisecond},
		{"sink timeout", 500 * time.Millisecond, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy.stalled.Store(false)
			s := open(t, redis.Config{URL: "redis://" + proxy.ln.Addr().String() + u.Path, Timeout: tc.timeout})
			if err := s.Check(context.Background()); err != nil {
				t.Fatalf("Check through the proxy: %v", err)
			}
			proxy.stalled.Store(true)
			ctx, cancel := context.WithTimeout(context.Background(), tc.ctxTimeout)
			defer cancel()
			events := []sinks.Event{sinktest.Event(stream, "k", []byte(`1`)), sinktest.Event(stream, "k", []byte(`2`))}
			errs := s.Publish(ctx, events)
			for i, err := range errs {
				if err == nil || sinks.IsPermanent(err) || sinks.IsUnavailable(err) || !strings.Contains(err.Error(), "may have been added") {
					t.Fatalf("event %d: %v, want a retryable error saying the entry may have been added", i, err)
				}
			}
		})
	}
}

// clientIDs returns the server's ids of the connections named name.
func clientIDs(t *testing.T, admin *goredis.Client, name string) []string {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(list, "\n") {
		fields := strings.Fields(line)
		if slices.Contains(fields, "name="+name) {
			for _, f := range fields {
				if id, ok := strings.CutPrefix(f, "id="); ok {
					out = append(out, id)
				}
			}
		}
	}
	return out
}

// TestReconnectAfterClientKill kills the sink's connections from the
// server side (CLIENT KILL ID, found by the name the sink sets) and checks
// the sink publishes again on a new connection, failing in between only
// with Unavailable.
func TestReconnectAfterClientKill(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stream := b.prefix + "reconnect"
	name := "test-kill-" + uuid.NewString()[:8]
	s, err := redis.New(name, redis.Config{URL: b.url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	first := sinktest.Event(stream, "k", []byte(`"before"`))
	publishOK(t, s, first)
	before := clientIDs(t, b.admin, "herald/"+name)
	if len(before) == 0 {
		t.Fatalf("no connection named herald/%s in CLIENT LIST", name)
	}
	for _, id := range before {
		if err := b.admin.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err(); err != nil {
			t.Fatalf("CLIENT KILL ID %s: %v", id, err)
		}
	}
	var delivered []string
	deadline := time.Now().Add(30 * time.Second)
	for attempt := 1; ; attempt++ {
		e := sinktest.Event(stream, "k", fmt.Appendf(nil, `"after %d"`, attempt))
		err := publish(t, s, e)[0]
		if err == nil {
			delivered = append(delivered, e.ID)
			break
		}
		if !sinks.IsUnavailable(err) {
			t.Fatalf("publish after CLIENT KILL: %v, want success or Unavailable", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful publish within 30s of CLIENT KILL; last: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := clientIDs(t, b.admin, "herald/"+name)
	if len(after) == 0 || slices.ContainsFunc(after, func(id string) bool { return slices.Contains(before, id) }) {
		t.Fatalf("connections before %v, after %v: want new ones only", before, after)
	}
	if got := ids(redistest.Entries(t, b.admin, stream)); !slices.Equal(got, append([]string{first.ID}, delivered...)) {
		t.Fatalf("stream holds %v, want %s then %v", got, first.ID, delivered)
	}
}

func TestPublishAfterCloseIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := open(t, redis.Config{URL: b.url})
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	errs := publish(t, s, sinktest.Event(b.prefix+"x", "", []byte(`{}`)))
	if !sinks.IsUnavailable(errs[0]) || !errors.Is(errs[0], redis.ErrClosed) {
		t.Fatalf("after Close: %v, want Unavailable ErrClosed", errs[0])
	}
	if err := s.Check(context.Background()); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("Check after Close = %v", err)
	}
}

// TestConcurrentPublish runs Publish calls with distinct keys at once, as
// the relay's workers do, and checks each key's order in the stream.
func TestConcurrentPublish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stream := b.prefix + "concurrent"
	s := open(t, redis.Config{URL: b.url})
	if !s.PublishesConcurrently() {
		t.Fatal("PublishesConcurrently = false")
	}
	const workers, batches, perBatch = 4, 5, 50
	var wg sync.WaitGroup
	want := map[string][]string{}
	for w := 0; w < workers; w++ {
		key := fmt.Sprintf("w%d", w)
		var all [][]sinks.Event
		for range batches {
			var events []sinks.Event
			for range perBatch {
				e := sinktest.Event(stream, key, []byte(`{}`))
				events = append(events, e)
				want[key] = append(want[key], e.ID)
			}
			all = append(all, events)
		}
		wg.Go(func() {
			for _, events := range all {
				publishOK(t, s, events...)
			}
		})
	}
	wg.Wait()
	got := map[string][]string{}
	for _, m := range redistest.Entries(t, b.admin, stream) {
		key, _ := m.Values[redis.FieldKey].(string)
		id, _ := m.Values[redis.FieldID].(string)
		got[key] = append(got[key], id)
	}
	for key, ids := range want {
		if !slices.Equal(got[key], ids) {
			t.Fatalf("key %s: stream order %v, want %v", key, got[key], ids)
		}
	}
}

// TestACLRefusalIsUnavailable creates an ACL user of its own (deleted at
// the end) allowed only keys under one prefix: an XADD elsewhere is
// refused with NOPERM, a setup error that pauses the sink.
func TestACLRefusalIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	user := "herald-test-" + uuid.NewString()[:8]
	ctx := context.Background()
	if err := b.admin.Do(ctx, "ACL", "SETUSER", user, "on", ">s3cr3t-acl", "~"+b.prefix+"allowed*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { b.admin.Do(context.Background(), "ACL", "DELUSER", user) })
	s := open(t, redis.Config{URL: b.url, Username: user, Password: "s3cr3t-acl"})
	allowed := sinktest.Event(b.prefix+"allowed", "", []byte(`{}`))
	denied := sinktest.Event(b.prefix+"denied", "", []byte(`{}`))
	errs := publish(t, s, allowed, denied)
	if errs[0] != nil {
		t.Fatalf("event to an allowed key: %v", errs[0])
	}
	if !sinks.IsUnavailable(errs[1]) || !strings.Contains(errs[1].Error(), "NOPERM") || strings.Contains(errs[1].Error(), "s3cr3t") {
		t.Fatalf("event to a denied key: %v, want Unavailable NOPERM", errs[1])
	}
}

// TestTLSToPlainServerIsUnavailable: TLS (tls.enabled, as rediss:// turns
// on) against the plain shared server fails the handshake, which pauses
// the sink.
func TestTLSToPlainServerIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rediss := strings.Replace(b.url, "redis://", "rediss://", 1)
	for _, cfg := range []redis.Config{
		{URL: b.url, TLS: sinkconfig.TLSConfig{Enabled: true}, Timeout: 2 * time.Second},
		{URL: rediss, Timeout: 2 * time.Second},
	} {
		s := open(t, cfg)
		errs := publish(t, s, sinktest.Event(b.prefix+"x", "", []byte(`{}`)))
		if !sinks.IsUnavailable(errs[0]) {
			t.Fatalf("%s with TLS against a plain server: %v, want Unavailable", cfg.URL, errs[0])
		}
	}
	if n, _ := b.admin.Exists(context.Background(), b.prefix+"x").Result(); n != 0 {
		t.Fatal("the stream was created over a failed TLS handshake")
	}
}
