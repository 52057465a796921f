package kafka

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// newCluster starts an in-process Kafka cluster speaking the wire protocol
// over TCP, closed when the test ends.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func createTopic(t testing.TB, c *kfake.Cluster, topic string, partitions int32, configs map[string]string) {
	t.Helper()
	if err := c.CreateTopic(topic, partitions, configs); err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
}

// newSink returns a sink on cfg, closed when the test ends.
func newSink(t testing.TB, cfg Config) *Sink {
	t.Helper()
	s, err := New("kafka-test", cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// readTopic reads every record of topic back with kafka-go connections to
// the partition leaders, partition by partition in offset order.
func readTopic(t testing.TB, addr, topic string, dialer *kafkago.Dialer) [][]kafkago.Message {
	t.Helper()
	if dialer == nil {
		dialer = &kafkago.Dialer{Timeout: 5 * time.Second}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		t.Fatalf("reading partitions of %s: %v", topic, err)
	}
	out := make([][]kafkago.Message, len(parts))
	for _, p := range parts {
		pc, err := dialer.DialLeader(ctx, "tcp", addr, topic, p.ID)
		if err != nil {
			t.Fatalf("dialing leader of %s/%d: %v", topic, p.ID, err)
		}
		last, err := pc.ReadLastOffset()
		if err != nil {
			pc.Close()
			t.Fatalf("reading last offset of %s/%d: %v", topic, p.ID, err)
		}
		for offset := int64(0); offset < last; {
			if _, err := pc.Seek(offset, kafkago.SeekAbsolute); err != nil {
				t.Fatalf("seeking %s/%d: %v", topic, p.ID, err)
			}
			pc.SetReadDeadline(time.Now().Add(5 * time.Second))
			batch := pc.ReadBatch(1, 50<<20)
			for {
				m, err := batch.ReadMessage()
				if err != nil {
					break
				}
				out[p.ID] = append(out[p.ID], m)
				offset = m.Offset + 1
			}
			if err := batch.Close(); err != nil && offset < last {
				t.Fatalf("reading %s/%d at %d: %v", topic, p.ID, offset, err)
			}
		}
		pc.Close()
	}
	return out
}

func all(parts [][]kafkago.Message) []kafkago.Message {
	var out []kafkago.Message
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func header(m kafkago.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func publish(t testing.TB, s *Sink, events []sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	return errs
}

func requireOK(t testing.TB, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			createTopic(t, c, destination, 3, nil)
			s, err := New("conformance", Config{Brokers: []string{addr}}, nil)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return s
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			s, err := New("conformance", Config{Brokers: []string{sinktest.ClosedAddr(t)}}, nil)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, m := range all(readTopic(t, addr, destination, nil)) {
				r := sinktest.Received{ID: header(m, HeaderID), Key: string(m.Key), Destination: m.Topic,
					Payload: m.Value, Headers: map[string]string{}}
				for _, h := range m.Headers {
					r.Headers[h.Key] = string(h.Value)
				}
				out = append(out, r)
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 2*DefaultMaxMessageBytes)
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
	})
}

func TestRecordCarriesEvent(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "orders.v1", 1, nil)
	s := newSink(t, Config{Brokers: []string{addr}})

	keyed := sinktest.Event("orders.v1", "order-7", []byte{0x00, 0xff, 'a'})
	keyed.Topic = "orders"
	keyed.ContentType = "application/x-protobuf"
	keyed.CreatedAt = time.Date(2025, 3, 4, 5, 6, 7, 8_000_000, time.UTC)
	keyed.Headers = map[string]string{"zeta": "last", "alpha": "first", HeaderID: "forged", "traceparent": "00-abc-01"}
	unkeyed := sinktest.Event("orders.v1", "", []byte(`{"n":1}`))
	requireOK(t, publish(t, s, []sinks.Event{keyed, unkeyed}))

	got := all(readTopic(t, addr, "orders.v1", nil))
	if len(got) != 2 {
		t.Fatalf("read %d records, want 2", len(got))
	}
	m := got[0]
	if string(m.Key) != "order-7" || !bytes.Equal(m.Value, keyed.Payload) {
		t.Fatalf("record key %q value %x, want order-7 %x", m.Key, m.Value, keyed.Payload)
	}
	if !m.Time.Equal(keyed.CreatedAt) {
		t.Fatalf("record time %s, want %s", m.Time, keyed.CreatedAt)
	}
	var names []string
	for _, h := range m.Headers {
		names = append(names, h.Key+"="+string(h.Value))
	}
	want := []string{HeaderID + "=" + keyed.ID, HeaderTopic + "=orders", HeaderContentType + "=application/x-protobuf",
		"alpha=first", "traceparent=00-abc-01", "zeta=last"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("headers\n got %v\nwant %v", names, want)
	}
	if got[1].Key != nil || header(got[1], HeaderID) != unkeyed.ID || header(got[1], HeaderContentType) != sinks.ContentTypeJSON {
		t.Fatalf("unkeyed record: key %v, headers %v", got[1].Key, got[1].Headers)
	}
}

func TestPartitionOrderPerKey(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	const topic, partitions = "order.by.key", 4
	createTopic(t, c, topic, partitions, nil)
	s := newSink(t, Config{Brokers: []string{addr}})

	const keys, perKey = 9, 30
	var events []sinks.Event
	for i := range keys * perKey {
		key := fmt.Sprintf("customer-%d", i%keys)
		events = append(events, sinktest.Event(topic, key, fmt.Appendf(nil, `{"i":%d}`, i)))
	}
	requireOK(t, publish(t, s, events[:100]))
	requireOK(t, publish(t, s, events[100:]))

	index := map[string]int{}
	for i, e := range events {
		index[e.ID] = i
	}
	parts := readTopic(t, addr, topic, nil)
	seen, used := 0, map[int]bool{}
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	for p, msgs := range parts {
		last := map[string]int{}
		for _, m := range msgs {
			i, ok := index[header(m, HeaderID)]
			if !ok {
				t.Fatalf("unknown record %v", m.Headers)
			}
			seen++
			key := string(m.Key)
			if want := (kafkago.Murmur2Balancer{}).Balance(m, ids...); want != p {
				t.Fatalf("key %s on partition %d, murmur2 says %d", key, p, want)
			}
			if l, ok := last[key]; ok && i < l {
				t.Fatalf("key %s: event %d after event %d on partition %d", key, i, l, p)
			}
			last[key] = i
		}
		if len(msgs) > 0 {
			used[p] = true
		}
	}
	if seen != len(events) {
		t.Fatalf("read %d records, want %d", seen, len(events))
	}
	if len(used) < 2 {
		t.Fatalf("%d keys landed on %d partition(s); want them spread", keys, len(used))
	}
}

func TestUnknownTopicFailsOnlyItsEvents(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "known", 2, nil)
	s := newSink(t, Config{Brokers: []string{addr}})

	events := []sinks.Event{
		sinktest.Event("known", "a", []byte(`1`)),
		sinktest.Event("missing.topic", "b", []byte(`2`)),
		sinktest.Event("known", "c", []byte(`3`)),
		sinktest.Event("missing.topic", "", []byte(`4`)),
	}
	errs := publish(t, s, events)
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("events to the known topic failed: %v, %v", errs[0], errs[2])
	}
	for _, i := range []int{1, 3} {
		err := errs[i]
		if err == nil {
			t.Fatalf("event %d to a missing topic succeeded", i)
		}
		if sinks.IsPermanent(err) || sinks.IsUnavailable(err) {
			t.Fatalf("event %d: a missing topic must be retried, not permanent or unavailable: %v", i, err)
		}
		if !strings.Contains(err.Error(), `"missing.topic" does not exist`) || !strings.Contains(err.Error(), "allow_auto_topic_creation") {
			t.Fatalf("event %d: error does not name the topic and the setting: %v", i, err)
		}
		if !errors.Is(err, kafkago.UnknownTopicOrPartition) {
			t.Fatalf("event %d: error does not wrap UnknownTopicOrPartition: %v", i, err)
		}
	}
	if got := len(all(readTopic(t, addr, "known", nil))); got != 2 {
		t.Fatalf("known topic holds %d records, want 2", got)
	}
}

func TestAutoTopicCreation(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
	addr := c.ListenAddrs()[0]
	s := newSink(t, Config{Brokers: []string{addr}, AllowAutoTopicCreation: true})
	requireOK(t, publish(t, s, []sinks.Event{sinktest.Event("created.on.use", "k", []byte(`{}`))}))
	if got := len(all(readTopic(t, addr, "created.on.use", nil))); got != 1 {
		t.Fatalf("auto-created topic holds %d records, want 1", got)
	}
}

func TestTooLargeIsPermanentBeforeSending(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "sized", 1, nil)
	const limit = 2048
	s := newSink(t, Config{Brokers: []string{addr}, MaxMessageBytes: limit})

	fits := sinktest.Event("sized", "k", nil)
	m := encode(fits)
	fits.Payload = bytes.Repeat([]byte("x"), limit-messageSize(&m)) // exactly at the limit
	big := sinktest.Event("sized", "k", bytes.Repeat([]byte("y"), limit))
	after := sinktest.Event("sized", "k", []byte(`after`))
	other := sinktest.Event("sized", "other", []byte(`other`))
	errs := publish(t, s, []sinks.Event{fits, big, after, other})

	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("events within the limit failed: %v, %v", errs[0], errs[3])
	}
	if !sinks.IsPermanent(errs[1]) {
		t.Fatalf("too large event: want permanent, got %v", errs[1])
	}
	if msg := errs[1].Error(); !strings.Contains(msg, "2048") || !strings.Contains(msg, "max_message_bytes") || !strings.Contains(msg, big.ID) {
		t.Fatalf("too large error does not name the event and the limit: %v", msg)
	}
	if !errors.Is(errs[2], sinks.ErrSkipped) {
		t.Fatalf("event after a failed one of its key: want ErrSkipped, got %v", errs[2])
	}
	got := all(readTopic(t, addr, "sized", nil))
	if len(got) != 2 || header(got[0], HeaderID) != fits.ID || header(got[1], HeaderID) != other.ID {
		t.Fatalf("topic holds %d records, want the fitting and the other one", len(got))
	}
}

// The broker's limit (the topic's max.message.bytes) is below the sink's:
// it rejects the whole produce request, and the sink must map that back to
// the one event really too large, keep the rest, and skip the rest of its key.
func TestBrokerRejectsTooLargePerEvent(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "tight", 1, map[string]string{"max.message.bytes": "400"})
	createTopic(t, c, "roomy", 1, nil)
	s := newSink(t, Config{Brokers: []string{addr}})

	small := func(key string) sinks.Event { return sinktest.Event("tight", key, []byte(`{"ok":true}`)) }
	events := []sinks.Event{
		small("k1"),
		sinktest.Event("tight", "k1", bytes.Repeat([]byte("z"), 600)),
		small("k1"),
		small("k2"),
		sinktest.Event("roomy", "k3", bytes.Repeat([]byte("z"), 600)),
	}
	errs := publish(t, s, events)
	if errs[0] != nil || errs[3] != nil || errs[4] != nil {
		t.Fatalf("fitting events failed: %v | %v | %v", errs[0], errs[3], errs[4])
	}
	if !sinks.IsPermanent(errs[1]) || !errors.Is(errs[1], kafkago.MessageSizeTooLarge) {
		t.Fatalf("event over the topic's limit: want permanent MessageSizeTooLarge, got %v", errs[1])
	}
	if !strings.Contains(errs[1].Error(), "max.message.bytes") {
		t.Fatalf("error does not name the limit: %v", errs[1])
	}
	if !errors.Is(errs[2], sinks.ErrSkipped) {
		t.Fatalf("later event of the failed key: want ErrSkipped, got %v", errs[2])
	}
	got := all(readTopic(t, addr, "tight", nil))
	if len(got) != 2 || header(got[0], HeaderID) != events[0].ID || header(got[1], HeaderID) != events[3].ID {
		t.Fatalf("tight topic holds %d records, want events 0 and 3", len(got))
	}
}

// TestHostileTopicsArePermanentBeforeSending covers destinations taken from
// event data that Kafka refuses or keeps for itself: names with white space,
// a slash, NUL, CRLF or a non-ASCII letter, ".", "..", the empty name, 250
// bytes, and internal topics (__consumer_offsets, __transaction_state, and
// one that exists on the broker). Each fails permanently, naming the topic,
// without being sent: the internal topic stays empty until
// allow_topic_prefixes names it, the refusal comes even with no broker
// answering, and the later events of a refused event's key are skipped.
func TestHostileTopicsArePermanentBeforeSending(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	longest := strings.Repeat("t", 249)
	createTopic(t, c, longest, 1, nil)
	createTopic(t, c, "__herald_internal", 1, nil)
	s := newSink(t, Config{Brokers: []string{addr}})

	illegal := map[string]string{
		"": "empty", ".": "not a legal", "..": "not a legal", strings.Repeat("t", 250): "at most 249",
		"a b": "a-z A-Z 0-9 . _ -", "a/b": "a-z A-Z 0-9 . _ -", "a\x00b": "a-z A-Z 0-9 . _ -",
		"orders\r\nx": "a-z A-Z 0-9 . _ -", "tópico": "a-z A-Z 0-9 . _ -",
		"__consumer_offsets": "allow_topic_prefixes", "__transaction_state": "allow_topic_prefixes",
		"__herald_internal": "allow_topic_prefixes",
	}
	var events []sinks.Event
	for topic := range illegal {
		events = append(events, sinktest.Event(topic, "k-"+topic, []byte(`{}`)))
	}
	later := sinktest.Event(longest, "k-__herald_internal", []byte(`{}`)) // behind a refused event of its key
	fits := sinktest.Event(longest, "fits", []byte(`{}`))
	errs := publish(t, s, append(events, later, fits))
	for i, e := range events {
		err := errs[i]
		if !sinks.IsPermanent(err) || sinks.IsUnavailable(err) {
			t.Errorf("topic %q: %v, want permanent", e.Destination, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("%q", e.Destination)) || !strings.Contains(msg, illegal[e.Destination]) {
			t.Errorf("topic %q: error %q does not name the topic and say %q", e.Destination, msg, illegal[e.Destination])
		}
	}
	if !errors.Is(errs[len(events)], sinks.ErrSkipped) {
		t.Fatalf("later event of a refused key: %v, want ErrSkipped", errs[len(events)])
	}
	if errs[len(events)+1] != nil {
		t.Fatalf("a 249-byte topic name: %v", errs[len(events)+1])
	}
	if got := all(readTopic(t, addr, "__herald_internal", nil)); len(got) != 0 {
		t.Fatalf("internal topic holds %d records, want none", len(got))
	}
	if got := all(readTopic(t, addr, longest, nil)); len(got) != 1 || header(got[0], HeaderID) != fits.ID {
		t.Fatalf("249-byte topic holds %d records, want only %s", len(got), fits.ID)
	}

	allowed := newSink(t, Config{Brokers: []string{addr}, AllowTopicPrefixes: []string{"__herald"}})
	internal := sinktest.Event("__herald_internal", "", []byte(`{}`))
	errs = publish(t, allowed, []sinks.Event{internal, sinktest.Event("__consumer_offsets", "", []byte(`{}`))})
	if errs[0] != nil {
		t.Fatalf("internal topic under an allowed prefix: %v", errs[0])
	}
	if !sinks.IsPermanent(errs[1]) {
		t.Fatalf("__consumer_offsets with only __herald allowed: %v, want permanent", errs[1])
	}
	if got := all(readTopic(t, addr, "__herald_internal", nil)); len(got) != 1 || header(got[0], HeaderID) != internal.ID {
		t.Fatalf("internal topic holds %d records, want only %s", len(got), internal.ID)
	}

	// Nothing listens: the refusal still comes, so it came before sending.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	errs = publish(t, newSink(t, Config{Brokers: []string{dead}}), []sinks.Event{sinktest.Event("__consumer_offsets", "", []byte(`{}`))})
	if !sinks.IsPermanent(errs[0]) || sinks.IsUnavailable(errs[0]) {
		t.Fatalf("internal topic with no broker: %v, want permanent", errs[0])
	}
}

func TestNothingListeningIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := newSink(t, Config{Brokers: []string{addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, []sinks.Event{sinktest.Event("t", "a", []byte(`1`)), sinktest.Event("t", "b", []byte(`2`))})
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("Publish took %s with nothing listening", d)
	}
	t.Logf("error: %v", errs[0])
	for i, err := range errs {
		if !sinks.IsUnavailable(err) {
			t.Fatalf("event %d: want Unavailable, got %v", i, err)
		}
	}
}

func TestClusterGoneIsUnavailableAndBounded(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "doomed", 2, nil)
	s := newSink(t, Config{Brokers: []string{addr}, WriteTimeout: 2 * time.Second})
	requireOK(t, publish(t, s, []sinks.Event{sinktest.Event("doomed", "a", []byte(`1`))}))
	c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, []sinks.Event{sinktest.Event("doomed", "a", []byte(`2`)), sinktest.Event("doomed", "b", []byte(`3`))})
	if d := time.Since(start); d > 8*time.Second+500*time.Millisecond {
		t.Fatalf("Publish took %s, past its context", d)
	}
	t.Logf("error after %s: %v", time.Since(start), errs[0])
	for i, err := range errs {
		if err == nil {
			t.Fatalf("event %d reported delivered to a closed cluster", i)
		}
		if !sinks.IsUnavailable(err) {
			t.Fatalf("event %d: want Unavailable, got %v", i, err)
		}
	}
}

func TestSASL(t *testing.T) {
	t.Parallel()
	const user, pass = "herald", "correct-horse-battery-staple"
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, kfake.EnableSASL(), kfake.Superuser(mech, user, pass))
			addr := c.ListenAddrs()[0]
			createTopic(t, c, "secured", 1, nil)

			good := newSink(t, Config{Brokers: []string{addr}, SASL: SASLConfig{Mechanism: mech, Username: user, Password: pass}})
			requireOK(t, publish(t, good, []sinks.Event{sinktest.Event("secured", "k", []byte(`{}`))}))
			m, _ := SASLConfig{Mechanism: mech, Username: user, Password: pass}.mechanism()
			if got := len(all(readTopic(t, addr, "secured", &kafkago.Dialer{Timeout: 5 * time.Second, SASLMechanism: m}))); got != 1 {
				t.Fatalf("read %d records, want 1", got)
			}

			const wrong = "wrong-password-do-not-print"
			bad := newSink(t, Config{Brokers: []string{addr}, SASL: SASLConfig{Mechanism: mech, Username: user, Password: wrong}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errs := bad.Publish(ctx, []sinks.Event{sinktest.Event("secured", "k", []byte(`{}`))})
			t.Logf("error: %v", errs[0])
			if !sinks.IsUnavailable(errs[0]) {
				t.Fatalf("refused authentication: want Unavailable, got %v", errs[0])
			}
			if strings.Contains(errs[0].Error(), wrong) || strings.Contains(fmt.Sprintf("%+v %#v", errs[0], bad.cfg), wrong) {
				t.Fatalf("password leaked: %v", errs[0])
			}
		})
	}
}

func TestCompressionRoundTrip(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	for _, codec := range []string{"none", "gzip", "snappy", "lz4", "zstd"} {
		topic := "compressed." + codec
		createTopic(t, c, topic, 1, nil)
		s := newSink(t, Config{Brokers: []string{addr}, Compression: codec})
		payload := bytes.Repeat([]byte(`{"compress":"me"}`), 50)
		requireOK(t, publish(t, s, []sinks.Event{sinktest.Event(topic, "k", payload), sinktest.Event(topic, "k", payload)}))
		got := all(readTopic(t, addr, topic, nil))
		if len(got) != 2 || !bytes.Equal(got[1].Value, payload) {
			t.Fatalf("%s: read %d records back", codec, len(got))
		}
	}
}

// A cross-topic key starts a new round: the second event of key k waits for
// the first, so it is skipped when the first fails.
func TestKeyAcrossTopicsKeepsOrder(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "second", 1, nil)
	s := newSink(t, Config{Brokers: []string{addr}})
	errs := publish(t, s, []sinks.Event{
		sinktest.Event("first.missing", "k", []byte(`1`)),
		sinktest.Event("second", "k", []byte(`2`)),
		sinktest.Event("second", "other", []byte(`3`)),
	})
	if errs[0] == nil || !errors.Is(errs[1], sinks.ErrSkipped) || errs[2] != nil {
		t.Fatalf("results: %v | %v | %v", errs[0], errs[1], errs[2])
	}
	if got := all(readTopic(t, addr, "second", nil)); len(got) != 1 || string(got[0].Key) != "other" {
		t.Fatalf("second topic holds %d records, want only key other", len(got))
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	const secret = "hunter2-never-print-me"
	ok := Config{Brokers: []string{"localhost:9092"}}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no brokers", func(c *Config) { c.Brokers = nil }, "brokers: must list at least one broker"},
		{"broker without port", func(c *Config) { c.Brokers = []string{"kafka"} }, "brokers[0]"},
		{"broker bad port", func(c *Config) { c.Brokers = []string{"kafka:x"} }, "brokers[0]"},
		{"compression", func(c *Config) { c.Compression = "brotli" }, "compression:"},
		{"acks", func(c *Config) { c.RequiredAcks = "two" }, "required_acks:"},
		{"balancer", func(c *Config) { c.Balancer = "random" }, "balancer:"},
		{"batch size", func(c *Config) { c.BatchSize = -1 }, "batch_size:"},
		{"batch timeout", func(c *Config) { c.BatchTimeout = -time.Second }, "batch_timeout:"},
		{"write timeout", func(c *Config) { c.WriteTimeout = -time.Second }, "write_timeout:"},
		{"max attempts", func(c *Config) { c.MaxAttempts = -1 }, "max_attempts:"},
		{"max message bytes", func(c *Config) { c.MaxMessageBytes = -1 }, "max_message_bytes:"},
		{"allowed prefix not internal", func(c *Config) { c.AllowTopicPrefixes = []string{"__ok", "orders"} }, `allow_topic_prefixes[1]: "orders" does not start with __`},
		{"allowed prefix illegal", func(c *Config) { c.AllowTopicPrefixes = []string{"__a b"} }, "allow_topic_prefixes[0]: the topic name holds"},
		{"ca file missing", func(c *Config) { c.TLS.CAFile = filepath.Join(dir, "nope.pem") }, "tls.ca_file:"},
		{"ca file not PEM", func(c *Config) { c.TLS.CAFile = notPEM }, "tls.ca_file:"},
		{"sasl mechanism", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "GSSAPI", Username: "u", Password: secret}
		}, "sasl.mechanism:"},
		{"sasl lowercase mechanism", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "plain", Username: "u", Password: secret}
		}, "sasl.mechanism:"},
		{"sasl without mechanism", func(c *Config) { c.SASL = SASLConfig{Username: "u", Password: secret} }, "sasl.mechanism:"},
		{"sasl without user", func(c *Config) { c.SASL = SASLConfig{Mechanism: "PLAIN", Password: secret} }, "sasl.username:"},
		{"sasl without password", func(c *Config) { c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u"} }, "sasl.password:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			cfg.Brokers = append([]string(nil), ok.Brokers...)
			tt.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
			_, newErr := New("bad", cfg, nil)
			if newErr == nil || !strings.Contains(newErr.Error(), tt.want) {
				t.Fatalf("New() = %v, want an error containing %q", newErr, tt.want)
			}
			for _, e := range []error{err, newErr} {
				if s := fmt.Sprintf("%v %+v %#v", e, cfg, cfg); strings.Contains(s, secret) {
					t.Fatalf("secret leaked: %s", s)
				}
			}
		})
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	full := Config{Brokers: []string{"a:1", "b:2"}, Compression: "zstd", RequiredAcks: "one", Balancer: "crc32",
		SASL: SASLConfig{Mechanism: "SCRAM-SHA-512", Username: "u", Password: secret}}
	if err := full.Validate(); err != nil {
		t.Fatalf("valid full config: %v", err)
	}
}

// Validation errors are gathered, not just the first.
func TestValidateReportsEveryField(t *testing.T) {
	t.Parallel()
	err := Config{Compression: "brotli", RequiredAcks: "many"}.Validate()
	for _, want := range []string{"brokers:", "compression:", "required_acks:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate() = %v, want it to mention %s", err, want)
		}
	}
}

var _ sasl.Mechanism = scramMechanism{}

// selfSigned writes a self-signed certificate for 127.0.0.1 to dir and
// returns the server's TLS config and the certificate's PEM path.
func selfSigned(t *testing.T, dir string) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, path
}

func TestTLS(t *testing.T) {
	t.Parallel()
	serverTLS, caFile := selfSigned(t, t.TempDir())
	c := newCluster(t, kfake.TLS(serverTLS))
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "private", 1, nil)

	trusted := newSink(t, Config{Brokers: []string{addr}, TLS: sinkconfig.TLSConfig{CAFile: caFile}})
	requireOK(t, publish(t, trusted, []sinks.Event{sinktest.Event("private", "k", []byte(`{}`))}))

	// The system roots do not know the broker's certificate.
	untrusted := newSink(t, Config{Brokers: []string{addr}, TLS: sinkconfig.TLSConfig{Enabled: true}})
	errs := publish(t, untrusted, []sinks.Event{sinktest.Event("private", "k", []byte(`{}`))})
	t.Logf("error: %v", errs[0])
	if !sinks.IsUnavailable(errs[0]) {
		t.Fatalf("unverifiable certificate: want Unavailable, got %v", errs[0])
	}
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	createTopic(t, c, "late", 1, nil)
	s, err := New("closing", Config{Brokers: c.ListenAddrs()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	errs := publish(t, s, []sinks.Event{sinktest.Event("late", "k", []byte(`{}`))})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "closed") || sinks.IsPermanent(errs[0]) {
		t.Fatalf("publish after Close: %v", errs[0])
	}
}

// TestCheck: Check reads the cluster's metadata; with nothing listening it
// fails as unavailable, naming the broker.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newCluster(t)
	var s sinks.Checker = newSink(t, Config{Brokers: c.ListenAddrs()})
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	createTopic(t, c, "orders", 1, nil)
	dc := s.(sinks.DestinationChecker)
	if err := dc.CheckDestinations(ctx, "orders"); err != nil {
		t.Fatalf("CheckDestinations(orders): %v", err)
	}
	if err := dc.CheckDestinations(ctx, "orders", "missing"); err == nil || !strings.Contains(err.Error(), `topic "missing"`) || strings.Contains(err.Error(), `"orders"`) {
		t.Fatalf("CheckDestinations(orders, missing) = %v, want an error naming only missing", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	err = newSink(t, Config{Brokers: []string{addr}}).Check(ctx)
	if !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Check with nothing listening = %v, want unavailable naming %s", err, addr)
	}
}
