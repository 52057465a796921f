// Package kafka is Herald's Kafka sink: it produces each event as one Kafka
// record with github.com/segmentio/kafka-go.
//
// # Records
//
// The record's topic is the event's Destination, its key the event's Key (a
// null key when the event has none), its value the payload byte for byte and
// its timestamp the event's CreatedAt. Its headers are
//
//	herald-id     the event id, the consumers' dedupe key (HeaderID)
//	herald-topic  the event's topic as the application wrote it (HeaderTopic)
//	content-type  the payload's media type (HeaderContentType)
//
// followed by every event header, sorted by name. An event header named like
// one of the three above is dropped: Herald's value wins.
//
// With format: cloudevents the record is a CloudEvent per the CloudEvents
// Kafka protocol binding (package cloudevents gives the attributes), with
// the same key, topic and timestamp. In the binary mode (cloudevents.mode:
// binary, the default) the value is the payload, content-type is
// datacontenttype, and every other attribute is a ce_ header (ce_specversion,
// ce_id, ce_source, ce_type, ce_subject, ce_time, and the extensions:
// ce_traceparent, ce_tracestate, ce_<header> for event headers with [a-z0-9]
// names); consumers dedupe on ce_id. In the structured mode the value is
// the JSON event format and the only header is content-type:
// application/cloudevents+json; charset=UTF-8.
//
// # Partitioning and order
//
// Keyed events are mapped to a partition by the configured balancer, murmur2
// by default, the Java client's default partitioner: Herald and a Java
// producer put one key on the same partition. Events without a key are spread
// at random and carry no order.
//
// Publish sends a batch in rounds. A round holds up to batch_size events and
// max_message_bytes bytes, and never two events of one key bound for two
// topics, so all the round's events of a key travel in one produce request
// to one partition, which the broker appends whole or not at all. Partitions
// are written concurrently; rounds one after the other. Concurrent calls
// share the writer, which batches their records together per partition.
//
// # Delivery guarantee
//
// An event is reported delivered (nil) only when the partition leader
// acknowledged it with the configured required_acks (all in-sync replicas by
// default); it is recorded as soon as its produce request is acknowledged,
// and reported at once to a caller that asked (sinks.WithResultFunc).
// Delivery is at least once: when a request times out after the
// broker stored it, or Publish's context ends while a request is in flight,
// the events are reported failed and the relay sends them again; consumers
// dedupe on the herald-id header. Within a key, order is kept: once an event
// of key K fails, the later events of K in the same call are not sent (they
// fail with sinks.ErrSkipped), and the events of K that shared its produce
// request fail with it. So a consumer never sees an event of K after a later
// one of K, except for the redelivered duplicates of at-least-once delivery.
//
// # Topics
//
// An event's destination comes from event data (its topic, or a route's
// template over its fields), so it is checked before anything is sent: a
// name Kafka would refuse (empty, "." or "..", over 249 bytes, a byte other
// than a-z A-Z 0-9 . _ -) fails permanently, and so does an internal topic
// (a name starting with "__": __consumer_offsets, __transaction_state)
// unless a prefix of it is listed in allow_topic_prefixes. The error names
// the topic and, for internal topics, the option.
//
// # Errors
//
//   - An event to a topic refused by the rules above is permanent
//     (dead-lettered), and nothing is sent for it.
//   - An event over max_message_bytes, or a single record the broker rejects
//     as too large, is permanent (dead-lettered): retrying cannot shrink it.
//   - Connection refused, DNS and TLS failures, refused SASL authentication,
//     a broker or enough in-sync replicas not available: sinks.Unavailable,
//     so the relay pauses the sink without counting attempts.
//   - A topic that does not exist is an ordinary, retried failure naming the
//     topic: topics are often created by operators after the routes that
//     use them, and dead-lettering every event until then would force a
//     manual replay; the relay's attempt limit still bounds the retries.
//     Only that topic's events fail; other topics in the same call go on.
//   - Anything else (leader moved, request timed out, cancelled context) is
//     retried.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Header names Herald sets on every record.
const (
	// HeaderID carries the event id, the consumers' dedupe key.
	HeaderID = "herald-id"
	// HeaderTopic carries the event's topic as the application wrote it.
	HeaderTopic = "herald-topic"
	// HeaderContentType carries the payload's media type.
	HeaderContentType = "content-type"
)

// Sink publishes events to Kafka. It implements sinks.Sink.
type Sink struct {
	name      string
	cfg       Config
	logger    *slog.Logger
	transport *kafkago.Transport
	writer    *kafkago.Writer
}

var (
	_ sinks.ConcurrentPublisher = (*Sink)(nil)
	_ sinks.DestinationChecker  = (*Sink)(nil)
)

// New validates cfg, fills its defaults and returns a sink called name.
// Connections are opened on first use, so New succeeds while the brokers are
// down. A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, fmt.Errorf("kafka sink %s: %w", name, err)
	}
	tlsCfg, err := cfg.TLS.Build("tls")
	if err != nil {
		return nil, fmt.Errorf("kafka sink %s: %w", name, err)
	}
	mech, err := cfg.SASL.mechanism()
	if err != nil {
		return nil, fmt.Errorf("kafka sink %s: %w", name, err)
	}
	logger = logger.With("sink", name)
	transport := &kafkago.Transport{ClientID: cfg.ClientID, TLS: tlsCfg, SASL: mech}
	w := &kafkago.Writer{
		Addr:                   kafkago.TCP(cfg.Brokers...),
		Balancer:               balancers[cfg.Balancer](),
		MaxAttempts:            cfg.MaxAttempts,
		BatchSize:              cfg.BatchSize,
		BatchBytes:             int64(cfg.MaxMessageBytes),
		BatchTimeout:           cfg.BatchTimeout,
		ReadTimeout:            cfg.WriteTimeout,
		WriteTimeout:           cfg.WriteTimeout,
		RequiredAcks:           acks[cfg.RequiredAcks],
		Compression:            compressions[cfg.Compression],
		Transport:              transport,
		AllowAutoTopicCreation: cfg.AllowAutoTopicCreation,
		Completion:             completed,
		ErrorLogger: kafkago.LoggerFunc(func(msg string, args ...any) {
			logger.Debug("kafka sink: writer: " + fmt.Sprintf(msg, args...))
		}),
	}
	return &Sink{name: name, cfg: cfg, logger: logger, transport: transport, writer: w}, nil
}

// Name implements sinks.Sink.
func (s *Sink) Name() string { return s.name }

// Check implements sinks.Checker: it asks the brokers for the cluster's
// metadata (no topics) with the sink's TLS and SASL settings, so those are
// checked too.
func (s *Sink) Check(ctx context.Context) error {
	_, err := s.metadata(ctx, []string{})
	return err
}

// CheckDestinations implements sinks.DestinationChecker: it asks the
// brokers for the topics' metadata and reports each topic that does not
// exist (unless allow_auto_topic_creation) or that Kafka refuses.
func (s *Sink) CheckDestinations(ctx context.Context, topics ...string) error {
	resp, err := s.metadata(ctx, topics)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range resp.Topics {
		switch {
		case t.Error == nil:
		case errors.Is(t.Error, kafkago.UnknownTopicOrPartition) && s.cfg.AllowAutoTopicCreation:
		default:
			errs = append(errs, fmt.Errorf("topic %q: %w", t.Name, t.Error))
		}
	}
	return errors.Join(errs...)
}

// metadata reads the metadata of topics (none: the brokers only) within
// write_timeout; failures to reach the brokers are sinks.Unavailable.
func (s *Sink) metadata(ctx context.Context, topics []string) (*kafkago.MetadataResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	// A transport of its own: the writer's answers metadata requests from
	// its cache, which would miss a topic created since.
	t := &kafkago.Transport{ClientID: s.transport.ClientID, TLS: s.transport.TLS, SASL: s.transport.SASL}
	defer t.CloseIdleConnections()
	c := &kafkago.Client{Addr: kafkago.TCP(s.cfg.Brokers...), Transport: t, Timeout: s.cfg.WriteTimeout}
	resp, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: topics})
	if err != nil {
		err = fmt.Errorf("reading metadata from %s: %w", strings.Join(s.cfg.Brokers, ","), err)
		if isUnavailable(err) || ctx.Err() != nil {
			return nil, sinks.Unavailable(err)
		}
		return nil, err
	}
	return resp, nil
}

// Close implements sinks.Sink: it waits for in-flight produce requests and
// closes the connections. When ctx ends first, Close returns ctx's error and
// the requests finish in the background.
func (s *Sink) Close(ctx context.Context) error {
	done := make(chan error, 1)
	go func() {
		err := s.writer.Close()
		s.transport.CloseIdleConnections()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("closing kafka sink %s: %w", s.name, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("closing kafka sink %s: %w", s.name, ctx.Err())
	}
}

// PublishesConcurrently implements sinks.ConcurrentPublisher: the writer
// is safe for concurrent use and batches the calls' records together per
// partition; calls that run at once never share a key, so a key's records
// still reach its partition in order.
func (s *Sink) PublishesConcurrently() bool { return true }

// round is the events sent together: at most one produce request per
// partition.
type round struct {
	idx     []int             // indexes into the events
	msgs    []kafkago.Message // msgs[k] encodes events[idx[k]]
	bytes   int
	keyDest map[string]string // key → destination within the round
}

// record is a message's WriterData: which event it carries, and how many
// messages shared its produce request.
type record struct {
	res      *sinks.Results
	i        int
	batchLen int
}

// Publish implements sinks.Sink: each event's result is recorded as the
// broker acknowledges its produce request. See the package documentation
// for the guarantees and the errors.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	res := sinks.NewResults(ctx, events, topic)
	r := round{keyDest: map[string]string{}}
	for start := 0; start < len(events) && !res.Ended(); {
		start = s.fill(&r, res, events, start)
		if len(r.idx) > 0 {
			s.send(ctx, &r, res, events)
		}
	}
	return res.Errors()
}

// topic names an event's topic in errors.
func topic(e *sinks.Event) string { return "kafka topic " + strconv.Quote(e.Destination) }

// fill starts a new round in r and adds events from start on, until the
// round is full; it returns the index of the first event left for the next
// round. Events it settles without sending (blocked, refused) get their
// result in res.
func (s *Sink) fill(r *round, res *sinks.Results, events []sinks.Event, start int) int {
	*r = round{keyDest: r.keyDest}
	clear(r.keyDest)
	i := start
	for ; i < len(events); i++ {
		e := &events[i]
		if res.Blocked(i) {
			continue
		}
		err := checkTopic(e.Destination, s.cfg.AllowTopicPrefixes)
		var m kafkago.Message
		if err == nil {
			m, err = s.encode(*e)
		}
		if err != nil {
			res.Fail(i, err)
			continue
		}
		size := messageSize(&m)
		if size > s.cfg.MaxMessageBytes {
			res.Fail(i, fmt.Errorf("max_message_bytes: %w", sinks.TooLarge(size, s.cfg.MaxMessageBytes)))
			continue
		}
		if len(r.idx) > 0 && (len(r.idx) >= s.cfg.BatchSize || r.bytes+size > s.cfg.MaxMessageBytes) {
			break
		}
		if e.Key != "" {
			if d, ok := r.keyDest[e.Key]; ok && d != e.Destination {
				break
			}
			r.keyDest[e.Key] = e.Destination
		}
		m.WriterData = &record{res: res, i: i}
		r.idx = append(r.idx, i)
		r.msgs = append(r.msgs, m)
		r.bytes += size
	}
	return i
}

// send writes a round, one WriteMessages call per topic (concurrently when
// there are several), so that a topic that does not exist fails only its
// own events.
func (s *Sink) send(ctx context.Context, r *round, res *sinks.Results, events []sinks.Event) {
	byTopic := map[string][]kafkago.Message{}
	var topics []string
	for _, m := range r.msgs {
		if _, ok := byTopic[m.Topic]; !ok {
			topics = append(topics, m.Topic)
		}
		byTopic[m.Topic] = append(byTopic[m.Topic], m)
	}
	var wg sync.WaitGroup
	for _, t := range topics {
		wg.Go(func() { s.write(ctx, byTopic[t], res, events) })
	}
	wg.Wait()
}

// write sends msgs (all of one topic) and records the result of each event
// whose Completion did not already.
func (s *Sink) write(ctx context.Context, msgs []kafkago.Message, res *sinks.Results, events []sinks.Event) {
	err := s.writer.WriteMessages(ctx, msgs...)
	var werrs kafkago.WriteErrors
	isWriteErrors := errors.As(err, &werrs) && len(werrs) == len(msgs)
	var tooLarge []kafkago.Message // rejected by the broker as part of a too large request
	for n, m := range msgs {
		rec := m.WriterData.(*record)
		e := &events[rec.i]
		switch {
		case err == nil, isWriteErrors && werrs[n] == nil:
			res.Delivered(rec.i)
		case !isWriteErrors:
			res.Fail(rec.i, s.classify(e, err))
		case isTooLarge(werrs[n]) && rec.batchLen > 1:
			tooLarge = append(tooLarge, m)
		default:
			res.Fail(rec.i, s.classify(e, werrs[n]))
		}
	}
	if len(tooLarge) > 0 {
		s.resendAlone(ctx, tooLarge, res, events)
	}
}

// resendAlone sends, one record per request and in order, the messages of
// produce requests the broker rejected as too large although each message
// fits max_message_bytes: the topic's max.message.bytes is below the sink's
// max_message_bytes. Each message is then accepted, or rejected on its own
// and failed permanently; the later messages of its key are skipped.
func (s *Sink) resendAlone(ctx context.Context, msgs []kafkago.Message, res *sinks.Results, events []sinks.Event) {
	s.logger.WarnContext(ctx, "kafka sink: broker rejected a produce request as too large; resending its records one by one; lower max_message_bytes to the topic's max.message.bytes",
		"topic", msgs[0].Topic, "records", len(msgs), "max_message_bytes", s.cfg.MaxMessageBytes)
	for _, m := range msgs {
		i := m.WriterData.(*record).i
		if res.Blocked(i) {
			continue
		}
		m.WriterData = &record{res: res, i: i}
		err := s.writer.WriteMessages(ctx, m)
		var werrs kafkago.WriteErrors
		if errors.As(err, &werrs) && len(werrs) == 1 {
			err = werrs[0]
		}
		if err != nil {
			res.Fail(i, s.classify(&events[i], err))
		} else {
			res.Delivered(i)
		}
	}
}

// completed is the writer's Completion callback: it tells each message
// how many messages shared its produce request, and records a delivery as
// soon as the broker acknowledged the request.
func completed(msgs []kafkago.Message, err error) {
	for i := range msgs {
		rec, ok := msgs[i].WriterData.(*record)
		if !ok {
			continue
		}
		rec.batchLen = len(msgs)
		if err == nil {
			rec.res.Delivered(rec.i)
		}
	}
}

func isTooLarge(err error) bool {
	return errors.Is(err, kafkago.MessageSizeTooLarge) || errors.Is(err, kafkago.RecordListTooLarge)
}

// classify marks err, the failure to publish e, with the class the relay
// acts on.
func (s *Sink) classify(e *sinks.Event, err error) error {
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return err
	case isTooLarge(err):
		return sinks.Permanent(fmt.Errorf(
			"the broker rejected the record as larger than the topic's max.message.bytes (max_message_bytes is %d; lower it to the topic's limit): %w",
			s.cfg.MaxMessageBytes, err))
	case errors.Is(err, kafkago.UnknownTopicOrPartition):
		if s.cfg.AllowAutoTopicCreation {
			return fmt.Errorf("topic %q does not exist and the broker did not create it: %w", e.Destination, err)
		}
		return fmt.Errorf("topic %q does not exist (allow_auto_topic_creation is off); retrying until it is created: %w", e.Destination, err)
	case errors.Is(err, io.ErrClosedPipe):
		return fmt.Errorf("sink %s is closed: %w", s.name, err)
	case isUnavailable(err):
		return sinks.Unavailable(err)
	}
	return err
}

// isUnavailable reports whether err says the cluster, rather than the
// event, is the problem.
func isUnavailable(err error) bool {
	var kerr kafkago.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafkago.BrokerNotAvailable, kafkago.NetworkException,
			kafkago.NotEnoughReplicas, kafkago.NotEnoughReplicasAfterAppend,
			kafkago.SASLAuthenticationFailed, kafkago.UnsupportedSASLMechanism, kafkago.IllegalSASLState,
			kafkago.ClusterAuthorizationFailed, kafkago.KafkaStorageError:
			return true
		}
		return false
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &opErr) || errors.As(err, &dnsErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || sinkconfig.IsTLSError(err)
}

// encode turns an event into the record Publish sends, in the configured
// format.
func (s *Sink) encode(e sinks.Event) (kafkago.Message, error) {
	if s.cfg.Format == FormatCloudEvents {
		return encodeCloudEvent(e, s.cfg.CloudEvents)
	}
	return encode(e), nil
}

// encodeCloudEvent turns an event into a CloudEvents record: the key is the
// event's key ("Every implementation MUST, by default, map the user
// provided record key to the Kafka record key", kafka-protocol-binding.md
// 3.1); in the binary mode the value is the payload and the attributes are
// ce_ headers with datacontenttype as content-type (3.2), in the structured
// mode the value is the JSON event format and content-type says so (3.3).
func encodeCloudEvent(e sinks.Event, ce cloudevents.Config) (kafkago.Message, error) {
	m := kafkago.Message{Topic: e.Destination, Time: e.CreatedAt}
	if e.Key != "" {
		m.Key = []byte(e.Key)
	}
	if m.Time.IsZero() {
		m.Time = time.Now()
	}
	if ce.Structured() {
		body, err := cloudevents.Structured(e, ce.Source)
		if err != nil {
			return m, err
		}
		m.Value = body
		m.Headers = []kafkago.Header{{Key: HeaderContentType, Value: []byte(cloudevents.MediaTypeKafka)}}
		return m, nil
	}
	m.Value = e.Payload
	attrs := cloudevents.Kafka.Headers(cloudevents.Attributes(e, ce.Source))
	m.Headers = make([]kafkago.Header, len(attrs))
	for i, a := range attrs {
		m.Headers[i] = kafkago.Header{Key: a.Name, Value: []byte(a.Value)}
	}
	return m, nil
}

// encode turns an event into the record of the herald format (see the
// package documentation). The key and the header values share one
// allocation.
func encode(e sinks.Event) kafkago.Message {
	n := len(e.Key) + len(e.ID) + len(e.Topic) + len(e.ContentType)
	for _, v := range e.Headers {
		n += len(v)
	}
	buf := make([]byte, 0, n)
	take := func(s string) []byte {
		start := len(buf)
		buf = append(buf, s...)
		return buf[start:len(buf):len(buf)]
	}
	m := kafkago.Message{Topic: e.Destination, Value: e.Payload, Time: e.CreatedAt}
	if e.Key != "" {
		m.Key = take(e.Key)
	}
	if m.Time.IsZero() {
		m.Time = time.Now()
	}
	hs := make([]kafkago.Header, 3, 3+len(e.Headers))
	hs[0] = kafkago.Header{Key: HeaderID, Value: take(e.ID)}
	hs[1] = kafkago.Header{Key: HeaderTopic, Value: take(e.Topic)}
	hs[2] = kafkago.Header{Key: HeaderContentType, Value: take(e.ContentType)}
	for k, v := range e.Headers {
		if k == HeaderID || k == HeaderTopic || k == HeaderContentType {
			continue
		}
		hs = append(hs, kafkago.Header{Key: k, Value: take(v)})
	}
	slices.SortFunc(hs[3:], func(a, b kafkago.Header) int { return strings.Compare(a.Key, b.Key) })
	m.Headers = hs
	return m
}

// messageSize is the size kafka-go accounts for m against its batch limit
// (key, value, headers and fixed framing); max_message_bytes is checked
// against it.
func messageSize(m *kafkago.Message) int {
	n := varintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += varintLen(len(h.Key)) + len(h.Key) + varintLen(len(h.Value)) + len(h.Value)
	}
	// crc/attributes/magic (4+1+1), key and value with int32 lengths, timestamp.
	return n + 4 + 1 + 1 + 4 + len(m.Key) + 4 + len(m.Value) + 8
}

// varintLen is the length of n as a zigzag varint.
func varintLen(n int) int {
	u := uint64(n) << 1
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}
