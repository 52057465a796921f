// Command benchpeer starts throwaway peers for `relay bench` on a machine
// with no Kafka broker, webhook receiver or Pub/Sub: an in-process Kafka
// broker (kfake, which speaks the Kafka wire protocol), an HTTP receiver
// that answers 204 to every event carrying a webhook-id header, and a
// Pub/Sub server (pstest, the client library's fake, which speaks the
// Pub/Sub gRPC API and keeps every message in memory).
//
//	go run ./internal/cmd/benchpeer &
//	relay bench --sink kafka --kafka-brokers 127.0.0.1:9092
//	relay bench --sink webhook --webhook-url http://127.0.0.1:8099/hook
//	relay bench --sink pubsub --pubsub-endpoint 127.0.0.1:8085
//
// It runs until SIGINT or SIGTERM. It is development tooling, kept out of
// the relay binary so that a production image carries no test servers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchpeer:", err)
		os.Exit(1)
	}
}

// run starts the peers args ask for, prints the bench flags that name them
// and serves until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("benchpeer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kafkaAddr := fs.String("kafka", "127.0.0.1:9092", "address of the Kafka broker (empty: none)")
	webhookAddr := fs.String("webhook", "127.0.0.1:8099", "address of the webhook receiver (empty: none)")
	pubsubAddr := fs.String("pubsub", "127.0.0.1:8085", "address of the Pub/Sub server (empty: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kafkaAddr != "" {
		host, port, err := splitPort(*kafkaAddr)
		if err != nil {
			return fmt.Errorf("-kafka: %w", err)
		}
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}))
		if err != nil {
			return fmt.Errorf("-kafka: starting the broker: %w", err)
		}
		defer c.Close()
		fmt.Fprintf(stdout, "kafka:   --kafka-brokers %s\n", c.ListenAddrs()[0])
	}
	if *webhookAddr != "" {
		ln, err := net.Listen("tcp", *webhookAddr)
		if err != nil {
			return fmt.Errorf("-webhook: %w", err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(receive), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		fmt.Fprintf(stdout, "webhook: --webhook-url http://%s/hook\n", ln.Addr())
	}
	if *pubsubAddr != "" {
		if _, _, err := splitPort(*pubsubAddr); err != nil {
			return fmt.Errorf("-pubsub: %w", err)
		}
		// pstest panics when it cannot listen: check the address first.
		ln, err := net.Listen("tcp", *pubsubAddr)
		if err != nil {
			return fmt.Errorf("-pubsub: %w", err)
		}
		_ = ln.Close()
		srv := pstest.NewServerWithAddress(*pubsubAddr)
		defer srv.Close()
		fmt.Fprintf(stdout, "pubsub:  --pubsub-endpoint %s\n", srv.Addr)
	}
	<-ctx.Done()
	return nil
}

// receive accepts an event: the relay's webhook sink always sends a
// webhook-id; anything else is a bad request.
func receive(w http.ResponseWriter, r *http.Request) {
	if _, err := io.Copy(io.Discard, r.Body); err != nil || r.Header.Get("webhook-id") == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// splitPort splits host:port, the port a number.
func splitPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, errors.New("port: " + err.Error())
	}
	return host, port, nil
}
