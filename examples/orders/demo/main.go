// Command demo runs Herald's orders example end to end in one process,
// needing only PostgreSQL, or MySQL/MariaDB:
//
//	go run ./examples/orders/demo            # 500 orders
//	go run ./examples/orders/demo -database-url mysql://root@127.0.0.1:3306/test   # on MariaDB
//	go run ./examples/orders/demo -short     # 100 orders and a 1s outage
//	go run ./examples/orders/demo -json      # the summary as JSON
//	go run ./examples/orders/demo -sinks redis,rabbitmq,mqtt   # also to servers running here
//	go run ./examples/orders/demo -sinks pubsub,sqs,sns        # Pub/Sub in-process, SQS/SNS on moto_server
//
// An order service commits orders and their events in one transaction, and
// a relay fans them out to an embedded NATS JetStream server, a webhook
// receiver and an SMTP server. The webhook fails for a while (HTTP 503,
// retried) and refuses a few events (HTTP 400, dead-lettered); the demo then
// fixes it, replays the dead letters and prints what reached every sink,
// with commit-to-publish latencies. -sinks adds Redis Streams, RabbitMQ
// and MQTT sinks whose servers already run, a Pub/Sub sink to Google's
// in-process fake, and SQS and SNS sinks to a moto_server the demo starts,
// each read back by a consumer of the demo's own.
//
// It lives here, not in the relay binary, because its embedded servers (and
// the Docker client that starts PostgreSQL when none answers) have no place
// in a production image.
//
// Exit status: 0 when every number adds up, 1 when the run failed or they do
// not, 2 for a usage error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/heraldhq/herald/examples/orders/internal/demo"
	"github.com/heraldhq/herald/internal/relayconfig"
)

// Exit statuses.
const (
	exitRuntime = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run parses args, runs the demo and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	var (
		opts    demo.Options
		asJSON  bool
		verbose bool
		brokers string
	)
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: go run ./examples/orders/demo [flags]

Runs Herald's orders example end to end in this process. Only PostgreSQL is
needed: -database-url, else DATABASE_URL, else
%s. When none answers and a Docker engine does,
a throwaway PostgreSQL container is started. A mysql:// URL
(mysql://root@127.0.0.1:3306/test) runs it on MySQL or MariaDB instead.
The demo works in a schema of its own (on MySQL a database): a fresh one
per run, %s_ and 8 random hex digits, so runs on a shared server never
touch another's tables; -schema NAME (starting with %s) names it and
replaces it if it exists. It is dropped at the end unless -keep. -sinks adds sinks: Redis (REDIS_URL, else %s),
RabbitMQ (RABBITMQ_URL, else %s) and MQTT (MQTT_URL,
else %s), whose servers must already run; pubsub, to
Google's Pub/Sub fake run in this process; sqs and sns, to AWS_ENDPOINT_URL
(moto, LocalStack) or else a moto_server the demo starts (pip install
'moto[server]').

Flags:
`, demo.DefaultDatabaseURL, demo.DefaultSchema, demo.DefaultSchema, demo.DefaultRedisURL, demo.DefaultRabbitMQURL, demo.DefaultMQTTURL)
		fs.PrintDefaults()
	}
	fs.StringVar(&opts.DatabaseURL, "database-url", "", "PostgreSQL connection string, or mysql://user:password@host:3306/database (default: DATABASE_URL, else the local PostgreSQL)")
	fs.StringVar(&opts.Schema, "schema", "", "schema (on MySQL, database) to work in, replaced if it exists; must start with "+demo.DefaultSchema+" (default: a fresh "+demo.DefaultSchema+"_XXXXXXXX per run)")
	fs.IntVar(&opts.Orders, "orders", 0, "orders to place and pay (default 500, 100 with -short)")
	fs.Float64Var(&opts.Rate, "rate", 0, "orders per second (default 100; negative: as fast as possible)")
	fs.DurationVar(&opts.Outage, "outage", 0, "how long the webhook answers 503 (default 3s, 1s with -short; 0 for none)")
	fs.BoolVar(&opts.Short, "short", false, "a quick run, for CI")
	fs.BoolVar(&opts.Keep, "keep", false, "keep the demo's schema (orders, outbox) at the end; the summary names it")
	fs.DurationVar(&opts.Timeout, "timeout", 3*time.Minute, "give up after this long")
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON (durations in milliseconds, in fields ending _ms)")
	fs.StringVar(&brokers, "sinks", "", "also deliver orders.* to these sinks, comma-separated: "+strings.Join(demo.BrokerSinks, ","))
	fs.BoolVar(&verbose, "v", false, "print the relay's warnings (each failed delivery)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected argument %q (flags only)\n", fs.Arg(0))
		return exitUsage
	}
	if opts.DatabaseURL == "" {
		opts.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if brokers != "" {
		opts.Brokers = strings.Split(brokers, ",")
	}
	opts.RedisURL, opts.RabbitMQURL, opts.MQTTURL = os.Getenv("REDIS_URL"), os.Getenv("RABBITMQ_URL"), os.Getenv("MQTT_URL")
	opts.AWSEndpoint = os.Getenv("AWS_ENDPOINT_URL")
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "outage" && opts.Outage == 0 {
			opts.Outage = -1 // asked for no outage
		}
	})
	opts.Progress = stderr
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && stderr == os.Stderr {
		opts.Live = true
	}
	if verbose {
		opts.Logger = relayconfig.Log{Level: "warn"}.NewLogger(stderr)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sum, err := demo.Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return exitRuntime
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			fmt.Fprintln(stderr, "demo: writing the summary:", err)
			return exitRuntime
		}
	} else {
		sum.Print(stdout)
	}
	if err := sum.Check(); err != nil {
		fmt.Fprintf(stderr, "demo: the numbers do not add up:\n%v\n", err)
		return exitRuntime
	}
	if !asJSON {
		fmt.Fprintln(stdout, "\nOK: every event reached every sink its route names.")
	}
	return 0
}
