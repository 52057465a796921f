package sns_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/heraldhq/herald/internal/awssink"
	"github.com/heraldhq/herald/internal/awstest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
	"github.com/heraldhq/herald/sinks/sns"
)

func TestMain(m *testing.M) { os.Exit(awstest.Main(m)) }

type bundle struct {
	endpoint string
	sns      *awssns.Client
	sqs      *awssqs.Client
}

func setup(t *testing.T) bundle {
	t.Helper()
	endpoint := awstest.Endpoint(t)
	return bundle{endpoint: endpoint, sns: awstest.SNS(endpoint), sqs: awstest.SQS(endpoint)}
}

// topic creates a topic (FIFO with a .fifo suffix) and a queue subscribed
// to it; it returns the topic's ARN and the queue's URL.
func (b bundle) topic(t *testing.T, suffix string) (string, string) {
	t.Helper()
	var topicAttrs, queueAttrs map[string]string
	if suffix == ".fifo" {
		topicAttrs = map[string]string{"FifoTopic": "true"}
		queueAttrs = map[string]string{"FifoQueue": "true"}
	}
	name := awstest.QueueName(suffix)
	arn := awstest.CreateTopic(t, b.sns, name, topicAttrs)
	url := awstest.CreateQueue(t, b.sqs, name, queueAttrs)
	awstest.SubscribeQueue(t, b.sns, b.sqs, arn, url)
	return arn, url
}

func config(endpoint string) sns.Config {
	return sns.Config{Connection: sns.Connection{Region: awstest.Region, Endpoint: endpoint,
		AccessKeyID: awstest.AccessKeyID, SecretAccessKey: awstest.SecretAccessKey, Timeout: 20 * time.Second}}
}

func open(t *testing.T, cfg sns.Config) *sns.Sink {
	t.Helper()
	s, err := sns.New("topics", cfg, nil)
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

// routed plays a route's destination: the ARN of the topic created for
// the suite's destination.
type routed struct {
	*sns.Sink
	arn string
}

func (r routed) Publish(ctx context.Context, events []sinks.Event) []error {
	events = append([]sinks.Event(nil), events...)
	for i := range events {
		events[i].Destination = r.arn
	}
	return r.Sink.Publish(ctx, events)
}

// TestConformance runs the suite on FIFO topics, read through a FIFO
// queue subscribed to each.
func TestConformance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	urls := map[string]string{}
	got := map[string][]sinktest.Received{}
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			arn, url := b.topic(t, ".fifo")
			mu.Lock()
			urls[destination] = url
			mu.Unlock()
			return routed{Sink: open(t, config(b.endpoint)), arn: arn}
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			return routed{Sink: open(t, config("http://"+sinktest.ClosedAddr(t))), arn: "arn:aws:sns:" + awstest.Region + ":123456789012:unreachable.fifo"}
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			mu.Lock()
			url := urls[destination]
			mu.Unlock()
			msgs := awstest.Receive(t, b.sqs, url)
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				var headers map[string]string
				if h := m.Attributes[awssink.AttrHeaders]; h != "" {
					if err := json.Unmarshal([]byte(h), &headers); err != nil {
						t.Fatalf("headers attribute %q: %v", h, err)
					}
				}
				got[destination] = append(got[destination], sinktest.Received{ID: m.Attributes[awssink.AttrID],
					Key: m.Attributes[awssink.AttrKey], Destination: destination, Payload: m.Payload(t), Headers: headers})
			}
			return append([]sinktest.Received(nil), got[destination]...)
		},
		// Over SNS's 256 KiB: refused before sending.
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, awssink.MaxMessageSize+1)
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
		Timeout:  60 * time.Second,
	})
}

// TestFIFOGroupAndDeduplication: the key is the group, the event id the
// deduplication id, so a resent event reaches subscribers once.
func TestFIFOGroupAndDeduplication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	arn, url := b.topic(t, ".fifo")
	s := open(t, config(b.endpoint))
	e := sinktest.Event(arn, "order-7", []byte(`{"n":1}`))
	publishOK(t, s, e)
	publishOK(t, s, e) // a resend after a lost answer
	sentinel := sinktest.Event(arn, "order-7", []byte(`{"sentinel":true}`))
	publishOK(t, s, sentinel)
	msgs := awstest.WaitFor(t, b.sqs, url, 2, 60*time.Second)
	if len(msgs) != 2 || msgs[0].Attributes[awssink.AttrID] != e.ID || msgs[1].Attributes[awssink.AttrID] != sentinel.ID {
		t.Fatalf("received %d messages, want the event once then the sentinel", len(msgs))
	}
	if msgs[0].GroupID != "order-7" {
		t.Fatalf("message group %q, want the key", msgs[0].GroupID)
	}
}

// TestStandardTopic publishes a binary payload to a standard topic.
func TestStandardTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	arn, url := b.topic(t, "")
	s := open(t, config(b.endpoint))
	e := sinktest.Event(arn, "", []byte{0, 1, 2, 0xff})
	e.ContentType = "application/octet-stream"
	publishOK(t, s, e)
	m := awstest.WaitFor(t, b.sqs, url, 1, 60*time.Second)[0]
	if string(m.Payload(t)) != string(e.Payload) || m.Attributes[awssink.AttrEncoding] != "base64" ||
		m.Attributes[awssink.AttrContentType] != "application/octet-stream" || m.Attributes[awssink.AttrTopic] != arn {
		t.Fatalf("received %q with %v", m.Body, m.Attributes)
	}
}

// TestNotAnARNIsPermanent: the event's topic is not an ARN (no route gave
// a destination): refused for good, named; the check at start says so.
func TestNotAnARNIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := open(t, config(b.endpoint))
	errs := publish(t, s, sinktest.Event("orders.created", "a", []byte(`{}`)), sinktest.Event("orders.created", "a", []byte(`{}`)))
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), `"orders.created" is not a topic ARN`) {
		t.Fatalf("event 0: %v, want permanent naming the destination", errs[0])
	}
	if !errors.Is(errs[1], sinks.ErrSkipped) {
		t.Fatalf("event 1 of the same key: %v, want skipped", errs[1])
	}
	if err := s.CheckDestinations(context.Background(), "orders.created"); err == nil || !strings.Contains(err.Error(), "not a topic ARN") {
		t.Fatalf("CheckDestinations: %v", err)
	}
}

// TestMissingTopicIsUnavailable: a topic that does not exist is a setup
// error, named.
func TestMissingTopicIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := open(t, config(b.endpoint))
	missing := "arn:aws:sns:us-east-1:123456789012:herald-test-missing"
	for i, err := range publish(t, s, sinktest.Event(missing, "a", []byte(`{}`)), sinktest.Event(missing, "b", []byte(`{}`))) {
		if !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), "herald-test-missing") {
			t.Fatalf("event %d: %v, want unavailable naming the topic", i, err)
		}
	}
	if err := s.CheckDestinations(context.Background(), missing); !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), "herald-test-missing") {
		t.Fatalf("CheckDestinations: %v, want unavailable naming the topic", err)
	}
	arn, _ := b.topic(t, "")
	if err := s.CheckDestinations(context.Background(), arn); err != nil {
		t.Fatalf("CheckDestinations of an existing topic: %v", err)
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
	arn := "arn:aws:sns:us-east-1:123456789012:t"
	for i, err := range publish(t, s, sinktest.Event(arn, "a", []byte(`{}`))) {
		if !sinks.IsUnavailable(err) {
			t.Fatalf("event %d: %v, want unavailable", i, err)
		}
	}
}

func TestBadCredentialsIsUnavailable(t *testing.T) {
	t.Parallel()
	setup(t) // skips without a server
	endpoint := awstest.StartServer(t, "INITIAL_NO_AUTH_ACTION_COUNT=0")
	cfg := config(endpoint)
	cfg.SecretAccessKey = "wrong-secret-XYZ"
	s := open(t, cfg)
	err := s.Check(context.Background())
	if !sinks.IsUnavailable(err) || strings.Contains(err.Error(), "wrong-secret-XYZ") {
		t.Fatalf("Check: %v, want unavailable, without the secret", err)
	}
	arn := "arn:aws:sns:us-east-1:123456789012:t"
	for i, err := range publish(t, s, sinktest.Event(arn, "a", []byte(`{}`))) {
		if !sinks.IsUnavailable(err) {
			t.Fatalf("event %d: %v, want unavailable", i, err)
		}
	}
}

func TestReconnectAfterDroppedConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := awstest.StartProxy(t, strings.TrimPrefix(b.endpoint, "http://"))
	arn, url := b.topic(t, "")
	s := open(t, config("http://"+proxy.Addr()))
	publishOK(t, s, sinktest.Event(arn, "a", []byte(`{"n":1}`)))
	before := proxy.Accepted()
	proxy.DropAll()
	publishOK(t, s, sinktest.Event(arn, "a", []byte(`{"n":2}`)))
	if proxy.Accepted() <= before {
		t.Fatalf("no new connection after the drop (%d accepted before, %d after)", before, proxy.Accepted())
	}
	awstest.WaitFor(t, b.sqs, url, 2, 60*time.Second)
}
