package nats_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

var quiet = slog.New(slog.DiscardHandler)

// open returns a sink closed in cleanup.
func open(t *testing.T, cfg nats.Config) *nats.Sink {
	t.Helper()
	s, err := nats.New("test", cfg, quiet)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func publish(t *testing.T, s sinks.Sink, events ...sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
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

func ids(msgs []natstest.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Header.Get(nats.HeaderMsgID)
	}
	return out
}

func TestConformance(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	nc := natstest.Connect(t, url)
	var streams sync.Map // destination → *natstest.TestStream
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			streams.Store(destination, natstest.Stream(t, nc, func(c *jetstream.StreamConfig) {
				c.Subjects = []string{destination}
			}))
			s, err := nats.New("conformance", nats.Config{URL: url}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			s, err := nats.New("conformance", nats.Config{URL: "nats://" + sinktest.ClosedAddr(t)}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			v, ok := streams.Load(destination)
			if !ok {
				t.Fatalf("no stream for %s", destination)
			}
			var out []sinktest.Received
			for _, m := range v.(*natstest.TestStream).Messages(t) {
				headers := map[string]string{}
				for k, vs := range m.Header {
					headers[k] = vs[0]
				}
				out = append(out, sinktest.Received{ID: m.Header.Get(nats.HeaderMsgID), Key: m.Header.Get(nats.HeaderKey),
					Destination: m.Subject, Payload: m.Data, Headers: headers})
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 2<<20) // over the server's max_payload
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
	})
}

func TestDeliversWithHeaders(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	str := natstest.Stream(t, natstest.Connect(t, url))
	s := open(t, nats.Config{URL: url, MaxPending: 3}) // a window smaller than the batch
	var events []sinks.Event
	for i := range 50 {
		key := fmt.Sprintf("k%d", i%4)
		if i%10 == 0 {
			key = ""
		}
		e := sinktest.Event(str.Subject("orders", "created"), key, fmt.Appendf(nil, `{"n":%d}`, i))
		e.Topic = "orders.created"
		e.Headers = map[string]string{"x-n": fmt.Sprint(i)}
		events = append(events, e)
	}
	publishOK(t, s, events...)
	got := str.Messages(t)
	if len(got) != len(events) {
		t.Fatalf("stream holds %d messages, want %d", len(got), len(events))
	}
	for i, m := range got {
		e := events[i] // one connection, one stream: stream order is send order
		if id := m.Header.Get(nats.HeaderMsgID); id != e.ID {
			t.Fatalf("message %d: %s = %q, want %q", i, nats.HeaderMsgID, id, e.ID)
		}
		if m.Subject != e.Destination || string(m.Data) != string(e.Payload) {
			t.Fatalf("message %d: %s %q, want %s %q", i, m.Subject, m.Data, e.Destination, e.Payload)
		}
		want := map[string]string{nats.HeaderTopic: "orders.created", nats.HeaderContentType: sinks.ContentTypeJSON,
			"x-n": fmt.Sprint(i)}
		for k, v := range want {
			if m.Header.Get(k) != v {
				t.Fatalf("message %d: header %s = %q, want %q", i, k, m.Header.Get(k), v)
			}
		}
		if vs, ok := m.Header[nats.HeaderKey]; e.Key == "" && ok || e.Key != "" && (len(vs) != 1 || vs[0] != e.Key) {
			t.Fatalf("message %d: %s = %v, want %q", i, nats.HeaderKey, vs, e.Key)
		}
	}
}

func TestRepublishedEventIsStoredOnce(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	str := natstest.Stream(t, natstest.Connect(t, url))
	s := open(t, nats.Config{URL: url})
	e := sinktest.Event(str.Subject("dup"), "k", []byte(`{"a":1}`))
	other := sinktest.Event(str.Subject("dup"), "k", []byte(`{"a":2}`))
	publishOK(t, s, e)
	e.Attempt = 2
	publishOK(t, s, e, other) // the retry of e succeeds, as a duplicate
	publishOK(t, s, e)
	got := ids(str.Messages(t))
	if want := []string{e.ID, other.ID}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("stream holds %v, want %v", got, want)
	}
}

func TestNoStreamCoversSubject(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	nc := natstest.Connect(t, url)
	covered := natstest.Stream(t, nc)
	uncovered := "herald_nostream." + covered.Name + ".x" // unique, covered by nothing
	for _, check := range []bool{true, false} {
		t.Run(fmt.Sprintf("check_streams=%v", check), func(t *testing.T) {
			s := open(t, nats.Config{URL: url, CheckStreams: &check})
			// The covered subject goes first: an uncovered one is a setup
			// error that stops the rest of the batch (Unavailable).
			good := sinktest.Event(covered.Subject(fmt.Sprint(check)), "b", []byte(`{}`))
			bad := sinktest.Event(uncovered, "a", []byte(`{}`))
			errs := publish(t, s, good, bad)
			if errs[0] != nil {
				t.Fatalf("covered subject: %v", errs[0])
			}
			err := errs[1]
			if !errors.Is(err, nats.ErrNoStream) || sinks.IsPermanent(err) || !sinks.IsUnavailable(err) {
				t.Fatalf("uncovered subject: got %v, want ErrNoStream marked Unavailable (pauses the sink)", err)
			}
			if !strings.Contains(err.Error(), uncovered) {
				t.Fatalf("error %q does not name the subject %s", err, uncovered)
			}
			if check && !strings.Contains(err.Error(), "create a stream") {
				t.Fatalf("error %q does not say to create a stream", err)
			}
		})
	}
	t.Run("stream deleted after first use", func(t *testing.T) {
		str := natstest.Stream(t, nc)
		s := open(t, nats.Config{URL: url})
		e := sinktest.Event(str.Subject("a"), "", []byte(`{}`))
		publishOK(t, s, e)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, str.Name); err != nil {
			t.Fatal(err)
		}
		errs := publish(t, s, sinktest.Event(str.Subject("a"), "", []byte(`{}`)))
		if !errors.Is(errs[0], nats.ErrNoStream) || sinks.IsPermanent(errs[0]) || !sinks.IsUnavailable(errs[0]) {
			t.Fatalf("publishing after the stream was deleted: %v, want ErrNoStream marked Unavailable", errs[0])
		}
		// The cache was dropped: the lookup now names the subject.
		errs = publish(t, s, sinktest.Event(str.Subject("a"), "", []byte(`{}`)))
		if !errors.Is(errs[0], nats.ErrNoStream) || !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), "create a stream") {
			t.Fatalf("second publish: %v, want Unavailable ErrNoStream from the lookup, saying to create a stream", errs[0])
		}
	})
	t.Run("CheckSubjects", func(t *testing.T) {
		s := open(t, nats.Config{URL: url})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := s.CheckSubjects(ctx, covered.Subject("a"), uncovered)
		if !errors.Is(err, nats.ErrNoStream) || !strings.Contains(err.Error(), uncovered) ||
			strings.Contains(err.Error(), covered.Subject("a")) {
			t.Fatalf("CheckSubjects = %v, want ErrNoStream naming only %s", err, uncovered)
		}
		// A missing stream is not cached: once created, the subject works.
		later := natstest.Stream(t, nc, func(c *jetstream.StreamConfig) { c.Subjects = []string{uncovered} })
		if err := s.CheckSubjects(ctx, uncovered); err != nil {
			t.Fatalf("CheckSubjects after creating the stream: %v", err)
		}
		e := sinktest.Event(uncovered, "", []byte(`{}`))
		publishOK(t, s, e)
		core := open(t, nats.Config{URL: url, Mode: nats.ModeCore})
		if err := core.CheckSubjects(ctx, "herald_nostream.core"); err != nil {
			t.Fatalf("CheckSubjects in core mode: %v, want nil (no stream needed)", err)
		}
		if got := ids(later.Messages(t)); len(got) != 1 || got[0] != e.ID {
			t.Fatalf("stream holds %v, want [%s]", got, e.ID)
		}
	})
}

func TestPayloadOverMaxPayloadIsPermanent(t *testing.T) {
	t.Parallel()
	srv := natstest.StartServer(t, func(o *server.Options) { o.MaxPayload = 1024 })
	str := natstest.Stream(t, natstest.Connect(t, srv.URL()))
	s := open(t, nats.Config{URL: srv.URL()})
	big := sinktest.Event(str.Subject("big"), "k", make([]byte, 1000)) // fits alone, not with headers
	after := sinktest.Event(str.Subject("big"), "k", []byte(`{}`))
	other := sinktest.Event(str.Subject("big"), "other", []byte(`{}`))
	errs := publish(t, s, big, after, other)
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "1024") {
		t.Fatalf("oversized event: %v, want permanent naming the limit 1024", errs[0])
	}
	if !errors.Is(errs[1], sinks.ErrSkipped) {
		t.Fatalf("later event of the same key: %v, want ErrSkipped", errs[1])
	}
	if errs[2] != nil {
		t.Fatalf("event of another key: %v", errs[2])
	}
	if got := ids(str.Messages(t)); len(got) != 1 || got[0] != other.ID {
		t.Fatalf("stream holds %v, want only %s", got, other.ID)
	}
}

func TestStreamRejectionReportsEachEvent(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	str := natstest.Stream(t, natstest.Connect(t, url), func(c *jetstream.StreamConfig) { c.MaxMsgSize = 512 })
	s := open(t, nats.Config{URL: url})
	big := sinktest.Event(str.Subject("k"), "k", make([]byte, 600))
	later := sinktest.Event(str.Subject("k"), "k", []byte(`{}`))
	errs := publish(t, s, big, later)
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "max_msg_size") {
		t.Fatalf("event over the stream's max_msg_size: %v, want permanent", errs[0])
	}
	// later was pipelined and stored: it is reported delivered (the relay
	// decides whether the key's failure holds it back), and a retry of it
	// is dropped as a duplicate.
	if errs[1] != nil {
		t.Fatalf("later event of the key, stored: %v, want delivered", errs[1])
	}
	publishOK(t, s, later)
	if got := ids(str.Messages(t)); len(got) != 1 || got[0] != later.ID {
		t.Fatalf("stream holds %v, want only %s once", got, later.ID)
	}
}

func TestInvalidEventsArePermanent(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	str := natstest.Stream(t, natstest.Connect(t, url))
	s := open(t, nats.Config{URL: url})
	wildcard := sinktest.Event(str.Subject("*"), "", []byte(`{}`))
	empty := sinktest.Event(str.Subject("a")+"..b", "", []byte(`{}`))
	rollup := sinktest.Event(str.Subject("a"), "", []byte(`{}`))
	rollup.Headers = map[string]string{"Nats-Rollup": "all"}
	colon := sinktest.Event(str.Subject("a"), "", []byte(`{}`))
	colon.Headers = map[string]string{"a:b": "x"}
	ok := sinktest.Event(str.Subject("a"), "", []byte(`{}`))
	errs := publish(t, s, wildcard, empty, rollup, colon, ok)
	for i, want := range []string{"wildcard", "empty token", "reserved", "printable ASCII"} {
		if !sinks.IsPermanent(errs[i]) || !strings.Contains(errs[i].Error(), want) {
			t.Errorf("event %d: %v, want permanent mentioning %q", i, errs[i], want)
		}
	}
	if errs[4] != nil {
		t.Fatalf("valid event: %v", errs[4])
	}
	if got := ids(str.Messages(t)); len(got) != 1 || got[0] != ok.ID {
		t.Fatalf("stream holds %v, want only %s", got, ok.ID)
	}
}

// TestReservedSubjectIsNotPublished covers a hostile destination: an event
// whose subject is $JS.API.STREAM.PURGE.<stream> (a topic a catch-all route
// passes through), which the NATS server takes as a request to purge the
// stream. In core mode and with check_streams off, where no stream lookup
// stands in the way, the sink refuses it permanently, naming the
// destination and allow_subject_prefixes, and sends nothing to that
// subject: the stream keeps its messages.
func TestReservedSubjectIsNotPublished(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	nc := natstest.Connect(t, url)
	off := false
	for name, cfg := range map[string]nats.Config{
		"core":                {URL: url, Mode: nats.ModeCore},
		"check_streams=false": {URL: url, CheckStreams: &off},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			str := natstest.Stream(t, nc)
			var filled []sinks.Event
			for i := range 20 {
				filled = append(filled, sinktest.Event(str.Subject("m"), "", fmt.Appendf(nil, `{"n":%d}`, i)))
			}
			publishOK(t, open(t, nats.Config{URL: url}), filled...)

			// One channel for both subscriptions: it receives in the order
			// the server forwarded, so whatever the sink sent to the purge
			// subject arrives before the sentinel it sent afterwards.
			purge := "$JS.API.STREAM.PURGE." + str.Name
			sentinelSubject := str.Subject("sentinel")
			seen := make(chan *natsgo.Msg, 64)
			for _, subject := range []string{purge, sentinelSubject} {
				sub, err := nc.ChanSubscribe(subject, seen)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sub.Unsubscribe() })
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}

			s := open(t, cfg)
			hostile := sinktest.Event(purge, "a", []byte(`{}`))
			sentinel := sinktest.Event(sentinelSubject, "b", []byte(`{}`))
			errs := publish(t, s, hostile, sentinel)
			if err := errs[0]; !sinks.IsPermanent(err) || !strings.Contains(err.Error(), purge) ||
				!strings.Contains(err.Error(), "allow_subject_prefixes") {
				t.Fatalf("event to %s: %v, want a permanent error naming it and allow_subject_prefixes", purge, err)
			}
			if errs[1] != nil {
				t.Fatalf("sentinel event: %v", errs[1])
			}
			for waiting := true; waiting; {
				select {
				case m := <-seen:
					if m.Subject == purge {
						t.Fatalf("the sink sent a message to %s", purge)
					}
					waiting = m.Header.Get(nats.HeaderMsgID) != sentinel.ID
				case <-time.After(10 * time.Second):
					t.Fatal("the sentinel event never arrived")
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for n := len(str.Messages(t)); n != len(filled)+1; n = len(str.Messages(t)) {
				if time.Now().After(deadline) {
					t.Fatalf("stream holds %d messages, want the %d it had plus the sentinel", n, len(filled))
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestAllowedReservedPrefix covers the operator's way out of the reserved
// subjects: a destination under $KV. is refused until
// allow_subject_prefixes names a prefix covering it, and then published to
// the stream behind it.
func TestAllowedReservedPrefix(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	var bucket string
	str := natstest.Stream(t, natstest.Connect(t, url), func(c *jetstream.StreamConfig) {
		bucket = "$KV." + c.Name + "."
		c.Subjects = []string{bucket + ">"}
	})
	e := sinktest.Event(bucket+"k1", "", []byte(`{}`))
	if errs := publish(t, open(t, nats.Config{URL: url}), e); !sinks.IsPermanent(errs[0]) {
		t.Fatalf("without allow_subject_prefixes: %v, want permanent", errs[0])
	}
	other := sinktest.Event("$KV.HERALD_OTHER_BUCKET.k1", "", []byte(`{}`))
	s := open(t, nats.Config{URL: url, AllowSubjectPrefixes: []string{bucket}})
	errs := publish(t, s, e, other)
	if errs[0] != nil {
		t.Fatalf("allowed prefix %s: %v", bucket, errs[0])
	}
	if !sinks.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "$KV.") {
		t.Fatalf("another bucket: %v, want permanent naming $KV.", errs[1])
	}
	if got := ids(str.Messages(t)); len(got) != 1 || got[0] != e.ID {
		t.Fatalf("stream holds %v, want [%s]", got, e.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := open(t, nats.Config{URL: url, Mode: nats.ModeCore}).CheckSubjects(ctx, "_INBOX.x"); !sinks.IsPermanent(err) {
		t.Fatalf("CheckSubjects(_INBOX.x) in core mode: %v, want permanent", err)
	}
}

func TestAckTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	nc := natstest.Connect(t, url)
	// A plain subscriber that never replies: the publish has a responder
	// but no PubAck ever comes.
	subject := "herald_test.silent." + fmt.Sprint(time.Now().UnixNano())
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	off := false
	s := open(t, nats.Config{URL: url, AckTimeout: 200 * time.Millisecond, CheckStreams: &off})
	errs := publish(t, s, sinktest.Event(subject, "", []byte(`{}`)))
	err = errs[0]
	if err == nil || sinks.IsPermanent(err) || sinks.IsUnavailable(err) || !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		t.Fatalf("got %v, want a retryable ack timeout", err)
	}
	if !strings.Contains(err.Error(), "duplicate") {
		t.Fatalf("error %q does not say the retry is deduplicated", err)
	}

	// The context ends before the ack timeout: Publish returns at the
	// deadline, retryably.
	long := open(t, nats.Config{URL: url, AckTimeout: time.Minute, CheckStreams: &off})
	// Connected first: a connection still being dialled when the context
	// ends (a loaded machine) is a different error.
	if err := long.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs = long.Publish(ctx, []sinks.Event{sinktest.Event(subject, "", []byte(`{}`))})
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("Publish took %s with a 200ms context: it waited for the one-minute ack_timeout", took)
	}
	if err := errs[0]; !errors.Is(err, context.DeadlineExceeded) || sinks.IsPermanent(err) || sinks.IsUnavailable(err) {
		t.Fatalf("got %v, want a retryable deadline error", err)
	}
}

func TestCoreFlushTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	// A server that completes the handshake and then answers no PING: the
	// flush after the batch times out on a live connection, however fast
	// or slow the machine is.
	s, err := nats.New("test", nats.Config{URL: silentNATSServer(t), Mode: nats.ModeCore, AckTimeout: 200 * time.Millisecond}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Close flushes too, unanswered like the batch's flush: its error
		// says nothing here.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	errs := publish(t, s, sinktest.Event("herald_test.flush.a", "a", []byte(`{}`)), sinktest.Event("herald_test.flush.b", "b", []byte(`{}`)))
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "flushing") || sinks.IsPermanent(err) || sinks.IsUnavailable(err) {
			t.Fatalf("event %d: %v, want a retryable flush error", i, err)
		}
	}
}

// silentNATSServer speaks just enough of the NATS protocol for a client to
// connect (INFO, then PONG to the handshake's PING) and then reads and
// ignores everything, answering no later PING.
func silentNATSServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if _, err := conn.Write([]byte(`INFO {"server_id":"silent","version":"2.10.0","proto":1,"headers":true,"max_payload":1048576}` + "\r\n")); err != nil {
					return
				}
				r := bufio.NewReader(conn)
				answered := false
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if !answered && strings.HasPrefix(line, "PING") {
						answered = true
						if _, err := conn.Write([]byte("PONG\r\n")); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return "nats://" + ln.Addr().String()
}

func TestAuthRefusedIsUnavailable(t *testing.T) {
	t.Parallel()
	const token, wrong = "s3cret-token-0xC0FFEE", "wr0ng-token-0xBADBAD"
	srv := natstest.StartServer(t, func(o *server.Options) { o.Authorization = token })
	str := natstest.Stream(t, natstest.Connect(t, srv.URL(), natsgo.Token(token)))
	e := sinktest.Event(str.Subject("a"), "", []byte(`{}`))
	hostPort := strings.TrimPrefix(srv.URL(), "nats://")
	for name, cfg := range map[string]nats.Config{
		"token":        {URL: srv.URL(), Token: wrong},
		"token in URL": {URL: "nats://" + wrong + "@" + hostPort},
		"no token":     {URL: srv.URL()},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t, cfg)
			errs := publish(t, s, e, e)
			for i, err := range errs {
				if !sinks.IsUnavailable(err) || !errors.Is(err, natsgo.ErrAuthorization) {
					t.Fatalf("event %d: %v, want Unavailable authorization violation", i, err)
				}
				if msg := fmt.Sprintf("%v %+v %#v", err, err, err); strings.Contains(msg, wrong) || strings.Contains(msg, token) {
					t.Fatalf("error shows the token: %s", msg)
				}
			}
		})
	}
	t.Run("right token", func(t *testing.T) {
		s := open(t, nats.Config{URL: srv.URL(), Token: token})
		publishOK(t, s, e)
	})
}

func TestUnreachableServerIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, mode := range []nats.Mode{nats.ModeJetStream, nats.ModeCore} {
		s := open(t, nats.Config{URL: "nats://" + addr, Mode: mode})
		start := time.Now()
		errs := publish(t, s, sinktest.Event("herald_test.x", "", []byte(`{}`)))
		if !sinks.IsUnavailable(errs[0]) || time.Since(start) > 3*time.Second {
			t.Fatalf("%s: %v after %s, want Unavailable fast", mode, errs[0], time.Since(start))
		}
		if err := s.CheckSubjects(context.Background(), "herald_test.x"); !sinks.IsUnavailable(err) {
			t.Fatalf("%s: CheckSubjects = %v, want Unavailable", mode, err)
		}
	}
}

func TestTLSToPlainServerIsUnavailable(t *testing.T) {
	t.Parallel()
	srv := natstest.StartServer(t)
	s := open(t, nats.Config{URL: srv.URL(), TLS: sinkconfig.TLSConfig{Enabled: true}})
	errs := publish(t, s, sinktest.Event("herald_test.x", "", []byte(`{}`)))
	if !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), "secure") {
		t.Fatalf("got %v, want Unavailable about TLS", errs[0])
	}
}

func TestCoreMode(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	// A stream captures the core publishes, so the test can read them back.
	str := natstest.Stream(t, natstest.Connect(t, url))
	s := open(t, nats.Config{URL: url, Mode: nats.ModeCore})
	var events []sinks.Event
	for i := range 20 {
		e := sinktest.Event(str.Subject("core"), fmt.Sprintf("k%d", i%3), fmt.Appendf(nil, `{"n":%d}`, i))
		e.Headers = map[string]string{"x-i": fmt.Sprint(i)}
		events = append(events, e)
	}
	publishOK(t, s, events...)
	deadline := time.Now().Add(5 * time.Second)
	var got []natstest.Message
	for len(got) < len(events) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		got = str.Messages(t)
	}
	if len(got) != len(events) {
		t.Fatalf("stream captured %d messages, want %d", len(got), len(events))
	}
	for i, m := range got {
		if m.Header.Get(nats.HeaderMsgID) != events[i].ID || m.Header.Get("x-i") != fmt.Sprint(i) ||
			m.Header.Get(nats.HeaderKey) != events[i].Key {
			t.Fatalf("message %d: headers %v, want event %s", i, m.Header, events[i].ID)
		}
	}
}

func TestPublishAfterCloseIsUnavailable(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	s, err := nats.New("closing", nats.Config{URL: url}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	str := natstest.Stream(t, natstest.Connect(t, url))
	publishOK(t, s, sinktest.Event(str.Subject("a"), "", []byte(`{}`)))
	for range 2 { // Close is idempotent
		if err := s.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	errs := publish(t, s, sinktest.Event(str.Subject("a"), "", []byte(`{}`)))
	if !sinks.IsUnavailable(errs[0]) || !errors.Is(errs[0], nats.ErrClosed) {
		t.Fatalf("after Close: %v, want Unavailable ErrClosed", errs[0])
	}
}

// TestServerRestart stops the server while a publisher runs, checks that
// publishing fails fast and retryably, restarts it, and checks that nothing
// reported delivered is missing, nothing is stored twice, and every key's
// events are stored in order.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	srv := natstest.StartServer(t)
	str := natstest.Stream(t, natstest.Connect(t, srv.URL(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(100*time.Millisecond)),
		func(c *jetstream.StreamConfig) { c.Storage = jetstream.FileStorage })
	s := open(t, nats.Config{URL: srv.URL(), AckTimeout: time.Second})

	const keys, batchSize, batches = 5, 250, 12
	var all []sinks.Event
	for i := range batchSize * batches {
		key := fmt.Sprintf("k%d", i%keys)
		all = append(all, sinktest.Event(str.Subject(key), key, fmt.Appendf(nil, `{"n":%d}`, i)))
	}
	delivered := map[string]bool{}
	var pendingRetry []sinks.Event // failed events, retried in order before new ones, like the relay
	stoppedCh := make(chan struct{})
	stopping, restarted := false, false
	failedBatches := 0
	next := 0
	deadline := time.Now().Add(30 * time.Second)
	for (next < len(all) || len(pendingRetry) > 0) && time.Now().Before(deadline) {
		batch := append([]sinks.Event(nil), pendingRetry...)
		for next < len(all) && len(batch) < batchSize {
			batch = append(batch, all[next])
			next++
		}
		if next >= len(all)/3 && !stopping {
			// Stop the server while this batch is on the wire.
			stopping = true
			go func() {
				srv.Shutdown()
				close(stoppedCh)
			}()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		errs := s.Publish(ctx, batch)
		took := time.Since(start)
		cancel()
		pendingRetry = pendingRetry[:0]
		for i, err := range errs {
			if err == nil {
				delivered[batch[i].ID] = true
				continue
			}
			if sinks.IsPermanent(err) {
				t.Fatalf("event %s: permanent error during an outage: %v", batch[i].ID, err)
			}
			pendingRetry = append(pendingRetry, batch[i])
		}
		if len(pendingRetry) == 0 {
			continue
		}
		failedBatches++
		t.Logf("batch of %d: %d failed in %s, first: %v", len(batch), len(pendingRetry), took.Round(time.Millisecond), errs[indexOfFirstError(errs)])
		// Each failure is the sink's own (disconnected, no ack within
		// ack_timeout), not the batch's context running out.
		for _, err := range errs {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a publish during the outage waited for its context (%s): %v", took, err)
			}
		}
		if failedBatches == 3 && !restarted {
			<-stoppedCh
			srv.Restart(t)
			restarted = true
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !restarted {
		t.Fatalf("the outage was not observed (%d failed batches)", failedBatches)
	}
	if len(pendingRetry) > 0 || next < len(all) {
		t.Fatalf("publishing did not resume: %d events left after the deadline", len(pendingRetry)+len(all)-next)
	}
	stored := str.Messages(t)
	count := map[string]int{}
	index := map[string]int{}
	for i, e := range all {
		index[e.ID] = i
	}
	last := map[string]int{}
	for _, m := range stored {
		id := m.Header.Get(nats.HeaderMsgID)
		count[id]++
		i := index[id]
		key := all[i].Key
		if prev, ok := last[key]; ok && i < prev {
			t.Fatalf("key %s: event %d stored after event %d", key, i, prev)
		}
		last[key] = i
	}
	for _, e := range all {
		if !delivered[e.ID] {
			t.Fatalf("event %s never reported delivered", e.ID)
		}
		if count[e.ID] != 1 {
			t.Fatalf("event %s stored %d times, want once", e.ID, count[e.ID])
		}
	}
}

func indexOfFirstError(errs []error) int {
	for i, err := range errs {
		if err != nil {
			return i
		}
	}
	return -1
}
