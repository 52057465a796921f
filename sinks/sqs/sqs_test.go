package sqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/heraldhq/herald/internal/awssink"
	"github.com/heraldhq/herald/internal/awstest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
	"github.com/heraldhq/herald/sinks/sqs"
)

func TestMain(m *testing.M) { os.Exit(awstest.Main(m)) }

type bundle struct {
	endpoint string
	admin    *awssqs.Client
}

func setup(t *testing.T) bundle {
	t.Helper()
	endpoint := awstest.Endpoint(t)
	return bundle{endpoint: endpoint, admin: awstest.SQS(endpoint)}
}

func config(endpoint string) sqs.Config {
	return sqs.Config{Connection: sqs.Connection{Region: awstest.Region, Endpoint: endpoint,
		AccessKeyID: awstest.AccessKeyID, SecretAccessKey: awstest.SecretAccessKey, Timeout: 20 * time.Second}}
}

func open(t *testing.T, cfg sqs.Config) *sqs.Sink {
	t.Helper()
	s, err := sqs.New("queues", cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func publish(t *testing.T, s sinks.Sink, events ...sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
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

// routed plays a route's destination template: the suite's destinations
// (sinktest.xxxxxxxx) are not valid queue names, so each is sent to a
// queue created for it.
type routed struct {
	*sqs.Sink
	queue string
}

func (r routed) Publish(ctx context.Context, events []sinks.Event) []error {
	events = append([]sinks.Event(nil), events...)
	for i := range events {
		events[i].Destination = r.queue
	}
	return r.Sink.Publish(ctx, events)
}

func received(t *testing.T, m awstest.Message, destination string) sinktest.Received {
	t.Helper()
	var headers map[string]string
	if h := m.Attributes[awssink.AttrHeaders]; h != "" {
		if err := json.Unmarshal([]byte(h), &headers); err != nil {
			t.Fatalf("headers attribute %q: %v", h, err)
		}
	}
	return sinktest.Received{ID: m.Attributes[awssink.AttrID], Key: m.Attributes[awssink.AttrKey],
		Destination: destination, Payload: m.Payload(t), Headers: headers}
}

// TestConformance runs the suite on FIFO queues, whose order per message
// group (the event key) is what a consumer can rely on. Each queue's
// maximum message size is 1 KiB, so that the server refuses the suite's
// Refused event, inside a batch of acceptable ones.
func TestConformance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	urls := map[string]string{}             // suite destination → queue URL
	got := map[string][]sinktest.Received{} // suite destination → received
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			name := strings.ReplaceAll(destination, ".", "-") + ".fifo"
			url := awstest.CreateQueue(t, b.admin, name, map[string]string{"FifoQueue": "true", "MaximumMessageSize": "1024"})
			mu.Lock()
			urls[destination] = url
			mu.Unlock()
			return routed{Sink: open(t, config(b.endpoint)), queue: name}
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			return routed{Sink: open(t, config("http://"+sinktest.ClosedAddr(t))), queue: "unreachable.fifo"}
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			mu.Lock()
			url := urls[destination]
			mu.Unlock()
			msgs := awstest.Receive(t, b.admin, url)
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				got[destination] = append(got[destination], received(t, m, destination))
			}
			return append([]sinktest.Received(nil), got[destination]...)
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 2000)
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
		Timeout:  60 * time.Second,
	})
}

// TestFIFOGroupAndDeduplication checks the ids SQS orders and dedupes by:
// the key as group (the event id for a keyless event), the event id as
// deduplication id, so that a resent event is dropped by the queue.
func TestFIFOGroupAndDeduplication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	name := awstest.QueueName(".fifo")
	url := awstest.CreateQueue(t, b.admin, name, map[string]string{"FifoQueue": "true"})
	s := open(t, config(b.endpoint))
	keyed := sinktest.Event(name, "order-7", []byte(`{"n":1}`))
	keyless := sinktest.Event(name, "", []byte(`{"n":2}`))
	publishOK(t, s, keyed, keyless)
	publishOK(t, s, keyed) // a resend after a lost answer
	msgs := awstest.WaitFor(t, b.admin, url, 2, 60*time.Second)
	if len(msgs) != 2 {
		t.Fatalf("received %d messages, want 2 (the resend deduplicated)", len(msgs))
	}
	for _, c := range []struct {
		e     sinks.Event
		group string
	}{{keyed, "order-7"}, {keyless, keyless.ID}} {
		var m *awstest.Message
		for i := range msgs {
			if msgs[i].Attributes[awssink.AttrID] == c.e.ID {
				m = &msgs[i]
			}
		}
		if m == nil {
			t.Fatalf("event %s not received", c.e.ID)
		}
		if m.GroupID != c.group || m.DeduplicationID != c.e.ID {
			t.Fatalf("event %s: group %q, deduplication id %q; want %q and the event id", c.e.ID, m.GroupID, m.DeduplicationID, c.group)
		}
	}
	// Nothing else arrives: a sentinel sent after the resend is the next
	// and last message.
	sentinel := sinktest.Event(name, "order-7", []byte(`{"sentinel":true}`))
	publishOK(t, s, sentinel)
	rest := awstest.WaitFor(t, b.admin, url, 1, 60*time.Second)
	if len(rest) != 1 || rest[0].Attributes[awssink.AttrID] != sentinel.ID {
		t.Fatalf("after the resend the queue held %d messages, want only the sentinel", len(rest))
	}
}

// TestStandardQueueByNameAndURL sends to a standard queue named by name
// and by URL, and reads every attribute back.
func TestStandardQueueByNameAndURL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	name := awstest.QueueName("")
	url := awstest.CreateQueue(t, b.admin, name, nil)
	s := open(t, config(b.endpoint))
	byName := sinktest.Event(name, "k", []byte(`{"by":"name"}`))
	byName.Headers = map[string]string{"x-tenant": "acme", "not an attribute name!": "v"}
	byURL := sinktest.Event(url, "", []byte("plain text"))
	byURL.ContentType = "text/plain"
	publishOK(t, s, byName, byURL)
	msgs := awstest.WaitFor(t, b.admin, url, 2, 60*time.Second)
	byID := map[string]awstest.Message{}
	for _, m := range msgs {
		byID[m.Attributes[awssink.AttrID]] = m
		if m.GroupID != "" || m.DeduplicationID != "" {
			t.Fatalf("a standard queue's message has group %q, deduplication id %q", m.GroupID, m.DeduplicationID)
		}
	}
	m := byID[byName.ID]
	want := map[string]string{awssink.AttrID: byName.ID, awssink.AttrTopic: name, awssink.AttrKey: "k",
		awssink.AttrContentType: sinks.ContentTypeJSON, awssink.AttrHeaders: `{"not an attribute name!":"v","x-tenant":"acme"}`}
	if fmt.Sprint(m.Attributes) != fmt.Sprint(want) || m.Body != `{"by":"name"}` {
		t.Fatalf("message %q with attributes %v, want %v", m.Body, m.Attributes, want)
	}
	m = byID[byURL.ID]
	if m.Body != "plain text" || m.Attributes[awssink.AttrContentType] != "text/plain" || m.Attributes[awssink.AttrKey] != "" {
		t.Fatalf("message by URL: %q with %v", m.Body, m.Attributes)
	}
}

// TestOversizedIsPermanentNotSent: an event over 256 KiB is refused before
// sending, the later event of its key is not sent, other keys go through.
func TestOversizedIsPermanentNotSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	name := awstest.QueueName("")
	url := awstest.CreateQueue(t, b.admin, name, nil)
	s := open(t, config(b.endpoint))
	events := []sinks.Event{
		sinktest.Oversized(name, "a", awssink.MaxMessageSize+1),
		sinktest.Event(name, "a", []byte(`{"n":1}`)),
		sinktest.Event(name, "b", []byte(`{"n":2}`)),
	}
	errs := publish(t, s, events...)
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "exceeds") {
		t.Fatalf("oversized event: %v, want permanent", errs[0])
	}
	if !errors.Is(errs[1], sinks.ErrSkipped) || errs[2] != nil {
		t.Fatalf("later events: %v, %v; want skipped and delivered", errs[1], errs[2])
	}
	msgs := awstest.WaitFor(t, b.admin, url, 1, 60*time.Second)
	if len(msgs) != 1 || msgs[0].Attributes[awssink.AttrID] != events[2].ID {
		t.Fatalf("queue received %d messages, want only event 2", len(msgs))
	}
}

// TestMoreThanTenEvents publishes 95 events of 3 keys (ten requests) to
// a FIFO queue and reads each key's events back in order.
func TestMoreThanTenEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	name := awstest.QueueName(".fifo")
	url := awstest.CreateQueue(t, b.admin, name, map[string]string{"FifoQueue": "true"})
	s := open(t, config(b.endpoint))
	var events []sinks.Event
	seq := map[string]int{}
	for i := range 95 {
		key := fmt.Sprintf("k%d", i%3)
		events = append(events, sinktest.Event(name, key, fmt.Appendf(nil, `{"key":%q,"seq":%d}`, key, seq[key])))
		seq[key]++
	}
	publishOK(t, s, events...)
	msgs := awstest.WaitFor(t, b.admin, url, len(events), 60*time.Second)
	next := map[string]int{}
	for _, m := range msgs {
		var p struct {
			Key string
			Seq int
		}
		if err := json.Unmarshal([]byte(m.Body), &p); err != nil {
			t.Fatal(err)
		}
		if p.Seq != next[p.Key] {
			t.Fatalf("key %s: got seq %d, want %d", p.Key, p.Seq, next[p.Key])
		}
		next[p.Key]++
	}
}

// TestMissingQueueIsUnavailable: a queue that does not exist is a setup
// error, by name and by URL, named in the error; the other events of the
// call are not sent.
func TestMissingQueueIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := open(t, config(b.endpoint))
	for _, missing := range []string{"herald-test-missing", b.endpoint + "/123456789012/herald-test-missing"} {
		errs := publish(t, s, sinktest.Event(missing, "a", []byte(`{}`)), sinktest.Event(missing, "b", []byte(`{}`)))
		for i, err := range errs {
			if !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), "herald-test-missing") {
				t.Fatalf("%s: event %d: %v, want unavailable naming the queue", missing, i, err)
			}
		}
	}
	err := s.CheckDestinations(context.Background(), "herald-test-missing")
	if !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), `queue "herald-test-missing"`) {
		t.Fatalf("CheckDestinations: %v, want unavailable naming the queue", err)
	}
}

func TestCheckDestinations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	name := awstest.QueueName("")
	url := awstest.CreateQueue(t, b.admin, name, nil)
	s := open(t, config(b.endpoint))
	if err := s.Check(context.Background()); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := s.CheckDestinations(context.Background(), name, url); err != nil {
		t.Fatalf("CheckDestinations: %v", err)
	}
}

func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func TestConnectionRefusedIsUnavailable(t *testing.T) {
	t.Parallel()
	s := open(t, config(closedPort(t)))
	if err := s.Check(context.Background()); !sinks.IsUnavailable(err) {
		t.Fatalf("Check: %v, want unavailable", err)
	}
	for i, err := range publish(t, s, sinktest.Event("q", "a", []byte(`{}`)), sinktest.Event("q", "b", []byte(`{}`))) {
		if !sinks.IsUnavailable(err) {
			t.Fatalf("event %d: %v, want unavailable", i, err)
		}
	}
}

// TestBadCredentialsIsUnavailable runs a server that checks credentials:
// unknown ones are refused, a setup error.
func TestBadCredentialsIsUnavailable(t *testing.T) {
	t.Parallel()
	setup(t) // skips without a server
	endpoint := awstest.StartServer(t, "INITIAL_NO_AUTH_ACTION_COUNT=0")
	cfg := config(endpoint)
	cfg.SecretAccessKey = "wrong-secret-XYZ"
	s := open(t, cfg)
	err := s.Check(context.Background())
	if !sinks.IsUnavailable(err) {
		t.Fatalf("Check: %v, want unavailable", err)
	}
	if strings.Contains(err.Error(), "wrong-secret-XYZ") {
		t.Fatalf("the error shows the secret: %v", err)
	}
	for i, err := range publish(t, s, sinktest.Event("orders", "a", []byte(`{}`))) {
		if !sinks.IsUnavailable(err) {
			t.Fatalf("event %d: %v, want unavailable", i, err)
		}
	}
}

// TestNoAnswerIsRetryable: a server that accepts the connection and never
// answers makes the events retryable (they may have been received), not
// permanent nor a pause of the sink.
func TestNoAnswerIsRetryable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	cfg := config("http://" + ln.Addr().String())
	cfg.Timeout = 500 * time.Millisecond
	s := open(t, cfg)
	q := "http://" + ln.Addr().String() + "/123456789012/q"
	for i, err := range publish(t, s, sinktest.Event(q, "a", []byte(`{}`))) {
		if err == nil || sinks.IsPermanent(err) || sinks.IsUnavailable(err) {
			t.Fatalf("event %d: %v, want a retryable error", i, err)
		}
	}
}

// TestReconnectAfterDroppedConnection drops the sink's connections from
// the server side (through a proxy) between two publishes.
func TestReconnectAfterDroppedConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := awstest.StartProxy(t, strings.TrimPrefix(b.endpoint, "http://"))
	name := awstest.QueueName("")
	url := awstest.CreateQueue(t, b.admin, name, nil)
	s := open(t, config("http://"+proxy.Addr()))
	publishOK(t, s, sinktest.Event(name, "a", []byte(`{"n":1}`)))
	before := proxy.Accepted()
	proxy.DropAll()
	publishOK(t, s, sinktest.Event(name, "a", []byte(`{"n":2}`)))
	if proxy.Accepted() <= before {
		t.Fatalf("no new connection after the drop (%d accepted before, %d after)", before, proxy.Accepted())
	}
	awstest.WaitFor(t, b.admin, url, 2, 60*time.Second)
}

func TestPublishAfterCloseIsUnavailable(t *testing.T) {
	t.Parallel()
	s := open(t, config(closedPort(t)))
	s.Close(context.Background())
	if err := publish(t, s, sinktest.Event("q", "", []byte(`{}`)))[0]; !errors.Is(err, awssink.ErrClosed) || !sinks.IsUnavailable(err) {
		t.Fatalf("Publish after Close: %v", err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	for _, c := range []struct {
		cfg  sqs.Config
		want string
	}{
		{sqs.Config{}, "region: required"},
		{sqs.Config{Connection: sqs.Connection{Region: "eu-west-1", Endpoint: "localhost:4566"}}, "endpoint: "},
		{sqs.Config{Connection: sqs.Connection{Region: "eu-west-1", Endpoint: "http://user:pa55@localhost"}}, "endpoint: \"http://[redacted]@localhost\""},
		{sqs.Config{Connection: sqs.Connection{Region: "eu-west-1", AccessKeyID: "AKIA"}}, "access_key_id and secret_access_key"},
		{sqs.Config{Connection: sqs.Connection{Region: "eu-west-1", SessionToken: "t"}}, "session_token: "},
		{sqs.Config{Connection: sqs.Connection{Region: "eu-west-1", Timeout: -time.Second}}, "timeout: -1s must not be negative"},
		{sqs.Config{Connection: sqs.Connection{Region: "eu-west-1", TLS: sinkconfig.TLSConfig{CAFile: "/nonexistent.pem"}}}, "tls.ca_file: "},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "pa55") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	t.Setenv("AWS_REGION", "eu-west-1")
	if err := (sqs.Config{}).Validate(); err != nil {
		t.Errorf("with AWS_REGION set, no region is needed: %v", err)
	}
}

func TestSecretIsRedactedWhenPrinted(t *testing.T) {
	cfg := config("http://127.0.0.1:1")
	cfg.SecretAccessKey = "s3cr3t-XYZ"
	cfg.SessionToken = "t0ken-XYZ"
	for _, out := range []string{fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg)} {
		if strings.Contains(out, "XYZ") {
			t.Fatalf("printed config shows a secret: %s", out)
		}
	}
}

func sqsNew(endpoint string) (*sqs.Sink, error) {
	return sqs.New("bench", config(endpoint), nil)
}
