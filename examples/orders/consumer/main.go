// Command consumer prints the events of Herald's orders example as they
// arrive from NATS JetStream, Kafka and the webhook, once each: delivery is
// at least once, so it drops an event id it has already printed for the
// same source (remembering the last -dedupe-size ids per source).
//
//	consumer                 run (settings from flags or the environment)
//	consumer healthcheck     exit 0 when the webhook listener answers /healthz
//
// Settings (flag, environment variable, default); an empty address turns
// its source off:
//
//	-nats-url        NATS_URL         empty
//	-nats-stream     NATS_STREAM      HERALD
//	-nats-durable    NATS_DURABLE     orders-consumer
//	-kafka-broker    KAFKA_BROKER     empty
//	-kafka-topics    KAFKA_TOPICS     orders
//	-kafka-group     KAFKA_GROUP      orders-consumer
//	-webhook-listen  WEBHOOK_LISTEN   empty (e.g. :8090; events are POSTed to /webhook)
//	-webhook-secret  WEBHOOK_SECRET   empty (no signature check)
//	-dedupe-size     DEDUPE_SIZE      100000
package main

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/heraldhq/herald/examples/orders/healthz"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/webhook"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

type settings struct {
	natsURL, natsStream, natsDurable     string
	kafkaBroker, kafkaTopics, kafkaGroup string
	webhookListen, webhookSecret         string
	dedupeSize                           int
}

func parseSettings(args []string, env func(string) (string, bool), stderr io.Writer) (*settings, []string, error) {
	get := func(name, def string) string {
		if v, ok := env(name); ok && v != "" {
			return v
		}
		return def
	}
	s := &settings{}
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&s.natsURL, "nats-url", get("NATS_URL", ""), "NATS server (empty: do not read NATS)")
	fs.StringVar(&s.natsStream, "nats-stream", get("NATS_STREAM", "HERALD"), "JetStream stream to read")
	fs.StringVar(&s.natsDurable, "nats-durable", get("NATS_DURABLE", "orders-consumer"), "durable consumer name")
	fs.StringVar(&s.kafkaBroker, "kafka-broker", get("KAFKA_BROKER", ""), "Kafka bootstrap broker host:port (empty: do not read Kafka)")
	fs.StringVar(&s.kafkaTopics, "kafka-topics", get("KAFKA_TOPICS", "orders"), "comma-separated Kafka topics")
	fs.StringVar(&s.kafkaGroup, "kafka-group", get("KAFKA_GROUP", "orders-consumer"), "Kafka consumer group")
	fs.StringVar(&s.webhookListen, "webhook-listen", get("WEBHOOK_LISTEN", ""), "listen address of the webhook receiver (empty: none)")
	fs.StringVar(&s.webhookSecret, "webhook-secret", get("WEBHOOK_SECRET", ""), "whsec_ secret to verify webhook signatures with (empty: no check)")
	size, err := strconv.Atoi(get("DEDUPE_SIZE", "100000"))
	if err != nil {
		return nil, nil, fmt.Errorf("DEDUPE_SIZE: %w", err)
	}
	fs.IntVar(&s.dedupeSize, "dedupe-size", size, "event ids remembered per source")
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if s.dedupeSize < 1 {
		return nil, nil, fmt.Errorf("-dedupe-size: must be at least 1, got %d", s.dedupeSize)
	}
	return s, fs.Args(), nil
}

// run reads every configured source until ctx ends. ready, when set,
// receives the webhook listener's address ("" without one) once every
// source is reading.
func run(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer, ready chan<- string) error {
	s, rest, err := parseSettings(args, env, stderr)
	if err != nil {
		return err
	}
	switch {
	case len(rest) == 1 && rest[0] == "healthcheck":
		return healthz.Check(ctx, "-webhook-listen", s.webhookListen)
	case len(rest) > 0:
		return fmt.Errorf("unknown command %q (want no command, or healthcheck)", strings.Join(rest, " "))
	}
	if s.natsURL == "" && s.kafkaBroker == "" && s.webhookListen == "" {
		return errors.New("nothing to read: set -nats-url, -kafka-broker or -webhook-listen")
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	p := &printer{w: stdout, seen: newSeenIDs(s.dedupeSize)}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		errc = make(chan error, 3)
		addr string
	)
	if s.natsURL != "" {
		stop, err := readNATS(ctx, s, p, logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	if s.kafkaBroker != "" {
		cl, err := kafkaClient(s)
		if err != nil {
			return err
		}
		defer cl.Close()
		wg.Add(1)
		go func() { defer wg.Done(); readKafka(ctx, cl, p, logger) }()
	}
	if s.webhookListen != "" {
		ln, err := net.Listen("tcp", s.webhookListen)
		if err != nil {
			return fmt.Errorf("-webhook-listen: %w", err)
		}
		addr = ln.Addr().String()
		srv := &http.Server{Handler: webhookHandler(sinkconfig.Secret(s.webhookSecret), p), ReadHeaderTimeout: 10 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("webhook receiver: %w", err)
			}
		}()
		defer func() {
			shutdownCtx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer c()
			_ = srv.Shutdown(shutdownCtx)
		}()
		logger.InfoContext(ctx, "consumer: webhook receiver listening", "addr", addr)
	}
	if ready != nil {
		ready <- addr
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// printer writes one line per new event and one per dropped duplicate.
type printer struct {
	mu   sync.Mutex
	w    io.Writer
	seen *seenIDs
}

func (p *printer) event(source, id, topic, key string, payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id == "" {
		fmt.Fprintf(p.w, "%-7s %-18s key=%s (no event id)\n", source, topic, key)
		return
	}
	if p.seen.seen(source + "/" + id) {
		fmt.Fprintf(p.w, "%-7s duplicate of %s dropped\n", source, id)
		return
	}
	fmt.Fprintf(p.w, "%-7s %-18s key=%s id=%s %s\n", source, topic, key, id, summary(payload))
}

// summary renders the interesting part of an order event's payload.
func summary(payload []byte) string {
	var p struct {
		Customer struct{ Name string } `json:"customer"`
		Total    json.Number           `json:"total"`
		Currency string                `json:"currency"`
	}
	if json.Unmarshal(payload, &p) != nil || p.Total == "" {
		return fmt.Sprintf("(%d bytes)", len(payload))
	}
	return fmt.Sprintf("%s %s for %q", p.Total, p.Currency, p.Customer.Name)
}

// seenIDs remembers the most recent ids, at most size of them (least
// recently seen forgotten first).
type seenIDs struct {
	size  int
	order *list.List // of string, most recent at the front
	ids   map[string]*list.Element
}

func newSeenIDs(size int) *seenIDs {
	return &seenIDs{size: size, order: list.New(), ids: map[string]*list.Element{}}
}

// seen records id and reports whether it was already remembered.
func (s *seenIDs) seen(id string) bool {
	if e, ok := s.ids[id]; ok {
		s.order.MoveToFront(e)
		return true
	}
	s.ids[id] = s.order.PushFront(id)
	if s.order.Len() > s.size {
		oldest := s.order.Back()
		s.order.Remove(oldest)
		delete(s.ids, oldest.Value.(string))
	}
	return false
}

// readNATS consumes the stream with a durable consumer, acknowledging each
// message once printed. It waits for the stream to exist. The returned
// function stops consuming.
func readNATS(ctx context.Context, s *settings, p *printer, logger *slog.Logger) (func(), error) {
	nc, err := nats.Connect(s.natsURL, nats.Timeout(5*time.Second), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("-nats-url: connecting to %s: %w", s.natsURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("-nats-url: %w", err)
	}
	var cons jetstream.Consumer
	for {
		cons, err = js.CreateOrUpdateConsumer(ctx, s.natsStream, jetstream.ConsumerConfig{
			Durable:       s.natsDurable,
			AckPolicy:     jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err == nil {
			break
		}
		logger.InfoContext(ctx, "consumer: waiting for the NATS stream", "stream", s.natsStream, "error", err)
		select {
		case <-ctx.Done():
			nc.Close()
			return nil, fmt.Errorf("-nats-stream: %s: %w", s.natsStream, err)
		case <-time.After(time.Second):
		}
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		h := m.Headers()
		p.event("nats", h.Get(natssink.HeaderMsgID), h.Get(natssink.HeaderTopic), h.Get(natssink.HeaderKey), m.Data())
		if err := m.Ack(); err != nil {
			logger.Warn("consumer: acknowledging a NATS message", "error", err)
		}
	})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("-nats-stream: consuming %s: %w", s.natsStream, err)
	}
	logger.InfoContext(ctx, "consumer: reading NATS", "stream", s.natsStream, "durable", s.natsDurable)
	return func() { cc.Stop(); nc.Close() }, nil
}

func kafkaClient(s *settings) (*kgo.Client, error) {
	var topics []string
	for t := range strings.SplitSeq(s.kafkaTopics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		return nil, errors.New("-kafka-topics: no topic given")
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(s.kafkaBroker, ",")...),
		kgo.ConsumerGroup(s.kafkaGroup),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		return nil, fmt.Errorf("-kafka-broker: %w", err)
	}
	return cl, nil
}

// readKafka prints records until ctx ends; the group commits offsets.
func readKafka(ctx context.Context, cl *kgo.Client, p *printer, logger *slog.Logger) {
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		fetches.EachError(func(topic string, partition int32, err error) {
			if ctx.Err() == nil {
				logger.Warn("consumer: reading Kafka", "topic", topic, "partition", partition, "error", err)
			}
		})
		fetches.EachRecord(func(rec *kgo.Record) {
			var id, topic string
			for _, h := range rec.Headers {
				switch h.Key {
				case "herald-id":
					id = string(h.Value)
				case "herald-topic":
					topic = string(h.Value)
				}
			}
			if topic == "" {
				topic = rec.Topic
			}
			p.event("kafka", id, topic, string(rec.Key), rec.Value)
		})
	}
}

// webhookHandler receives the webhook sink's envelopes on POST /webhook,
// checking their signature when secret is set.
func webhookHandler(secret sinkconfig.Secret, p *printer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhook", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 2<<20))
		if err != nil {
			http.Error(w, "reading body", http.StatusBadRequest)
			return
		}
		if secret != "" {
			if err := webhook.Verify(secret, r.Header, body, 5*time.Minute); err != nil {
				http.Error(w, err.Error(), http.StatusUnauthorized)
				return
			}
		}
		var env struct {
			ID      string          `json:"id"`
			Topic   string          `json:"topic"`
			Key     string          `json:"key"`
			Payload json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(body, &env); err != nil || env.ID == "" {
			http.Error(w, "not a Herald envelope", http.StatusBadRequest)
			return
		}
		p.event("webhook", env.ID, env.Topic, env.Key, env.Payload)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}
