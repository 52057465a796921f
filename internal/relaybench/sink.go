package relaybench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"text/template"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/kafka"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/webhook"
)

// destinationEnv is the destination a run publishes to: a way to make one
// sink per relay, the route's destination, and what to tear down.
type destinationEnv struct {
	newSink     func(name string) (sinks.Sink, error)
	destination *template.Template // nil: the event's topic
	closers     []func(context.Context) error
}

func (d *destinationEnv) close(ctx context.Context) error {
	var errs []error
	for i := len(d.closers) - 1; i >= 0; i-- {
		errs = append(errs, d.closers[i](ctx))
	}
	return errors.Join(errs...)
}

// startDestination prepares cfg.Sink. name is unique to the run and safe in
// stream, subject and topic names.
func startDestination(ctx context.Context, cfg Config, name string, logger *slog.Logger) (*destinationEnv, error) {
	d := &destinationEnv{}
	var err error
	switch cfg.Sink {
	case SinkDiscard:
		d.newSink = func(name string) (sinks.Sink, error) { return sinks.NewDiscard(name), nil }
	case SinkNATS:
		err = d.startNATS(ctx, cfg, name, logger)
	case SinkKafka:
		err = d.startKafka(cfg, name, logger)
	case SinkWebhook:
		err = d.startWebhook(logger)
	}
	if err != nil {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return nil, errors.Join(err, d.close(closeCtx))
	}
	return d, nil
}

func literal(dest string) *template.Template {
	return template.Must(template.New("destination").Parse(dest))
}

func (d *destinationEnv) startNATS(ctx context.Context, cfg Config, name string, logger *slog.Logger) error {
	url := cfg.NATSURL
	if cfg.NATSEmbedded {
		dir, err := os.MkdirTemp("", "herald-bench-nats")
		if err != nil {
			return fmt.Errorf("creating the embedded NATS store directory: %w", err)
		}
		d.closers = append(d.closers, func(context.Context) error { return os.RemoveAll(dir) })
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
			StoreDir: dir, NoLog: true, NoSigs: true})
		if err != nil {
			return fmt.Errorf("--nats-embedded: creating the server: %w", err)
		}
		srv.Start()
		d.closers = append(d.closers, func(context.Context) error { srv.Shutdown(); srv.WaitForShutdown(); return nil })
		if !srv.ReadyForConnections(10 * time.Second) {
			return errors.New("--nats-embedded: the server was not ready within 10s")
		}
		url = srv.ClientURL()
	}
	nc, err := natsgo.Connect(url, natsgo.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("--nats-url: connecting to %s: %w", url, err)
	}
	d.closers = append(d.closers, func(context.Context) error { nc.Close(); return nil })
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("--nats-url: JetStream on %s: %w", url, err)
	}
	storage := jetstream.MemoryStorage
	if cfg.NATSFileStorage {
		storage = jetstream.FileStorage
	}
	stream := jetstream.StreamConfig{
		Name:       "HERALD_BENCH_" + name,
		Subjects:   []string{"herald_bench." + name + ".>"},
		Storage:    storage,
		Duplicates: 2 * time.Minute,
		Discard:    jetstream.DiscardOld,
	}
	if cfg.NATSMaxMsgs > 0 {
		stream.MaxMsgs = int64(cfg.NATSMaxMsgs)
	}
	if _, err := js.CreateStream(ctx, stream); err != nil {
		return fmt.Errorf("creating JetStream stream %s on %s: %w", stream.Name, url, err)
	}
	d.closers = append(d.closers, func(ctx context.Context) error {
		if err := js.DeleteStream(ctx, stream.Name); err != nil {
			return fmt.Errorf("deleting JetStream stream %s: %w", stream.Name, err)
		}
		return nil
	})
	d.destination = literal("herald_bench." + name + ".events")
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return natssink.New(sinkName, natssink.Config{URL: url}, logger)
	}
	return nil
}

func (d *destinationEnv) startKafka(cfg Config, name string, logger *slog.Logger) error {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return fmt.Errorf("starting the in-process Kafka cluster: %w", err)
	}
	d.closers = append(d.closers, func(context.Context) error { cluster.Close(); return nil })
	topic := "herald_bench_" + name
	if err := cluster.CreateTopic(topic, int32(cfg.KafkaPartitions), nil); err != nil {
		return fmt.Errorf("creating Kafka topic %s: %w", topic, err)
	}
	brokers := cluster.ListenAddrs()
	d.destination = literal(topic)
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return kafka.New(sinkName, kafka.Config{Brokers: brokers}, logger)
	}
	return nil
}

func (d *destinationEnv) startWebhook(logger *slog.Logger) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening for the webhook receiver: %w", err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.Copy(io.Discard, r.Body); err != nil || r.Header.Get("webhook-id") == "" {
				http.Error(w, "bad request", http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	d.closers = append(d.closers, srv.Shutdown)
	key := make([]byte, 24)
	_, _ = rand.Read(key)
	secret := sinks.Secret("whsec_" + base64.StdEncoding.EncodeToString(key))
	url := "http://" + ln.Addr().String() + "/hook"
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return webhook.New(sinkName, webhook.Config{URL: url, Secret: secret}, logger)
	}
	return nil
}
