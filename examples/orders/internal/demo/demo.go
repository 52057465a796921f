// Package demo is the engine of `go run ./examples/orders/demo`: Herald's orders example running whole in
// one process, needing nothing but PostgreSQL, or MySQL/MariaDB.
//
// It migrates a demo schema (a database on MySQL), starts an embedded NATS server with JetStream,
// a webhook receiver and an SMTP server, and runs the order service (package
// shop) and a relay between them. It then places and pays a stream of
// orders over HTTP. Meanwhile the webhook answers 503 for a while, so its
// events are retried, and refuses (400) the orders.paid event of a few
// orders, which are dead-lettered. It then "fixes" the webhook, replays the
// dead letters (package relay/deadletter), waits until every event reached
// every sink its route names, and returns a Summary: orders paid, events per
// sink, retries, dead letters, replays, and commit-to-publish latency
// measured at the receivers (the order service notes each commit's time, the
// receivers each event's arrival).
//
// Routes: orders.* (orders.created, orders.paid) go to NATS and the
// webhook, email.* (email.order_paid) to the email sink.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldhq/herald/examples/orders/shop"
	"github.com/heraldhq/herald/examples/orders/templates"
	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/email"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/webhook"
)

// DefaultSchema starts the name of every schema (on MySQL, database) the
// demo creates and drops: a run that names none works in a fresh one,
// DefaultSchema followed by random hex digits (herald_demo_5f3a9c01), so
// that runs sharing a server never touch each other's tables.
const DefaultSchema = "herald_demo"

// Sink names.
const (
	SinkNATS    = "nats"
	SinkWebhook = "webhook"
	SinkEmail   = "email"
)

// Options configure a run. The zero value runs the full demo on the local
// server.
type Options struct {
	// DatabaseURL is the PostgreSQL, or with a mysql:// URL the MySQL or
	// MariaDB, to use. Defaults to DefaultDatabaseURL.
	DatabaseURL string
	// StartPostgres starts a server when no PostgreSQL answers at
	// DatabaseURL (never for a mysql:// URL). Defaults to StartContainer
	// (testcontainers-go, needs Docker).
	StartPostgres StartPostgresFunc
	// Schema is the schema (on MySQL, the database) the demo works in,
	// dropped at the end unless Keep. It must start with DefaultSchema. A
	// schema named here is replaced: dropped first if it exists. Defaults
	// to a fresh name per run (FreshSchema), which must not exist.
	Schema string
	// Keep leaves the schema (orders and outbox) in place at the end.
	Keep bool
	// Short is the CI size: 100 orders, a 1s outage. Orders and Outage
	// override it.
	Short bool
	// Orders is how many orders to place and pay. Defaults to 500 (100
	// when Short).
	Orders int
	// Rate is the orders placed per second. Defaults to 100; negative means
	// as fast as possible.
	Rate float64
	// Outage is how long the webhook answers 503, from the first request it
	// fails; it starts once a fifth of the orders are paid. Defaults to 3s
	// (1s when Short); negative means no outage.
	Outage time.Duration
	// RejectEvery makes the webhook refuse the orders.paid event of every
	// RejectEvery-th order (the 17th, then every RejectEvery after it) until
	// the dead letters are replayed. Defaults to 50.
	RejectEvery int
	// Timeout bounds the whole run. Defaults to 3 minutes.
	Timeout time.Duration
	// Progress receives notes and the live progress line. Nil means none.
	Progress io.Writer
	// Live rewrites the progress line in place (\r), for a terminal;
	// otherwise it is printed every few seconds as a plain line.
	Live bool
	// Logger receives the relay's and the order service's logs. Defaults to
	// none.
	Logger *slog.Logger
	// Brokers adds sinks of the other types (BrokerSinks: redis, rabbitmq,
	// mqtt, pubsub, sqs, sns), routed orders.* like NATS and the webhook.
	// Defaults to none: the demo then needs only its database.
	Brokers []string
	// RedisURL, RabbitMQURL and MQTTURL are the servers of Brokers.
	// Default to DefaultRedisURL, DefaultRabbitMQURL and DefaultMQTTURL.
	RedisURL, RabbitMQURL, MQTTURL string
	// AWSEndpoint is the SQS/SNS-compatible server of the sqs and sns
	// sinks (moto, LocalStack), which must accept any credentials.
	// Defaults to a moto_server the demo starts (it must be on PATH).
	AWSEndpoint string
}

// FreshSchema returns a new schema name for a run: DefaultSchema, an
// underscore and 8 random hex digits.
func FreshSchema() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it crashes the program instead)
	return DefaultSchema + "_" + hex.EncodeToString(b)
}

func (o Options) withDefaults() Options {
	if o.DatabaseURL == "" {
		o.DatabaseURL = DefaultDatabaseURL
	}
	if o.StartPostgres == nil {
		o.StartPostgres = StartContainer
	}
	if o.Schema == "" {
		o.Schema = FreshSchema()
	}
	if o.Orders == 0 {
		o.Orders = 500
		if o.Short {
			o.Orders = 100
		}
	}
	if o.Rate == 0 {
		o.Rate = 100
	}
	if o.Outage == 0 {
		o.Outage = 3 * time.Second
		if o.Short {
			o.Outage = time.Second
		}
	}
	o.Outage = max(o.Outage, 0)
	if o.RejectEvery == 0 {
		o.RejectEvery = 50
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.RedisURL == "" {
		o.RedisURL = DefaultRedisURL
	}
	if o.RabbitMQURL == "" {
		o.RabbitMQURL = DefaultRabbitMQURL
	}
	if o.MQTTURL == "" {
		o.MQTTURL = DefaultMQTTURL
	}
	return o
}

func (o Options) validate() error {
	switch {
	case o.Orders < 1 || o.Orders > 100000:
		return fmt.Errorf("orders: must be between 1 and 100000, got %d", o.Orders)
	case o.Outage > time.Minute:
		return fmt.Errorf("outage: must be at most 1m, got %s", o.Outage)
	case o.RejectEvery < 1:
		return fmt.Errorf("reject every: must be at least 1, got %d", o.RejectEvery)
	case !strings.HasPrefix(o.Schema, DefaultSchema):
		return fmt.Errorf("schema: %q must start with %q (the demo drops it)", o.Schema, DefaultSchema)
	}
	if err := validateBrokers(o.Brokers); err != nil {
		return err
	}
	tables := migrations.Tables{Schema: o.Schema, Table: "outbox"}
	if mysqlurl.Is(o.DatabaseURL) {
		if _, err := mysqlurl.Config(o.DatabaseURL); err != nil {
			return fmt.Errorf("database url: %w", err)
		}
		_, err := mysqlmigrations.NewTables(tables)
		return err
	}
	if _, err := pgx.ParseConfig(o.DatabaseURL); err != nil {
		return fmt.Errorf("database url: %s", relayconfig.ScrubPassword(err.Error(), o.DatabaseURL))
	}
	return tables.Validate()
}

// rejected reports whether the i-th order (from 0) has its orders.paid
// refused by the webhook until the replay.
func (o Options) rejected(i int) bool { return i%o.RejectEvery == 17%o.RejectEvery }

// Run runs the demo and returns its summary. The error is non-nil when the
// demo could not run (no database, ctx ended, a component failed to start);
// whether the numbers add up is Summary.Check's business.
func Run(ctx context.Context, opts Options) (*Summary, error) {
	fresh := opts.Schema == ""
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	d := &run{opts: opts, freshSchema: fresh, out: opts.Progress, started: time.Now()}
	defer d.cleanup()
	if err := d.setup(ctx); err != nil {
		return nil, err
	}
	if err := d.drive(ctx); err != nil {
		return nil, err
	}
	return d.summary(ctx)
}

// run is one demo run: its components and what it measured.
type run struct {
	opts Options
	// freshSchema: the schema's name was made for this run (Options named
	// none), so it must not exist yet.
	freshSchema bool
	out         io.Writer
	started     time.Time
	closers     []func()

	containerd bool
	db         database
	tables     migrations.Tables
	dead       *deadletter.Store

	nats *natsPeer
	hook *webhookPeer
	mail *mailPeer
	// brokers are the sinks of Options.Brokers, in that order.
	brokers []*brokerPeer
	// aws is the SQS/SNS server, once the sqs or sns sink asked for it.
	aws  *awsServer
	rl   *relay.Relay
	obs  *observer
	svc  *http.Server
	base string // the order service's URL

	commitMu sync.Mutex
	commits  map[string]time.Time // event id → commit time
	topics   map[string]string    // event id → topic

	paid         atomic.Int64
	replayed     int64
	deadLettered int64
	phase        atomic.Value // string
}

func (d *run) note(s string) { fmt.Fprintln(d.out, s) }

// addCloser registers a cleanup step; they run in reverse order.
func (d *run) addCloser(f func()) { d.closers = append(d.closers, f) }

func (d *run) cleanup() {
	for _, f := range slices.Backward(d.closers) {
		f()
	}
}

// database is what the demo needs of its database, one implementation
// per database (postgres.go, mysql.go) holding its SQL.
type database interface {
	// String names the server, its password redacted.
	String() string
	// schemaExists reports whether the demo's schema (database) exists.
	schemaExists(ctx context.Context) (bool, error)
	// dropSchema drops the demo's schema (database) with everything in it.
	dropSchema(ctx context.Context) error
	// migrate creates the schema, Herald's tables and the orders table.
	migrate(ctx context.Context) error
	deadLetters() (*deadletter.Store, error)
	newRelay(cfg relay.Config) (*relay.Relay, error)
	newShop(cfg shop.Config) (*shop.Service, error)
	// polls reports whether the relay has no notifications and so is
	// woken after each commit (Relay.Wake).
	polls() bool
	close()
}

func (d *run) setup(ctx context.Context) error {
	d.tables = migrations.Tables{Schema: d.opts.Schema, Table: "outbox"}
	var err error
	if mysqlurl.Is(d.opts.DatabaseURL) {
		d.db, err = openMySQL(ctx, d.opts.DatabaseURL, d.tables)
	} else {
		d.db, d.containerd, err = d.openPostgres(ctx)
	}
	if err != nil {
		return err
	}
	d.addCloser(d.db.close)

	// A schema of its own: Herald's tables and the orders table. One named
	// for this run is new (another's of the same name is never dropped);
	// one the operator named is replaced.
	if d.freshSchema {
		exists, err := d.db.schemaExists(ctx)
		if err != nil {
			return err
		}
		if exists {
			return fmt.Errorf("schema %s exists already: run the demo again for another name, or replace it with -schema %s", d.tables.Schema, d.tables.Schema)
		}
	} else if err := d.db.dropSchema(ctx); err != nil {
		return err
	}
	if !d.opts.Keep {
		d.addCloser(func() {
			dropCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := d.db.dropSchema(dropCtx); err != nil {
				d.note("demo: " + err.Error())
			}
		})
	}
	if err := d.db.migrate(ctx); err != nil {
		return err
	}
	if d.dead, err = d.db.deadLetters(); err != nil {
		return err
	}
	end := "dropped at the end"
	if d.opts.Keep {
		end = "kept at the end (-keep)"
	}
	d.note(fmt.Sprintf("demo: %s, schema %s migrated; %s", d.db, d.tables.Schema, end))

	// The sinks' peers.
	tmp, err := os.MkdirTemp("", "herald-demo-")
	if err != nil {
		return fmt.Errorf("creating a temporary directory: %w", err)
	}
	d.addCloser(func() { _ = os.RemoveAll(tmp) })
	if d.nats, err = startNATS(ctx, tmp); err != nil {
		return err
	}
	d.addCloser(d.nats.close)
	if d.hook, err = startWebhook(); err != nil {
		return err
	}
	d.addCloser(func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.hook.close(closeCtx)
	})
	if d.mail, err = startMail(); err != nil {
		return err
	}
	d.addCloser(d.mail.close)
	if err := templates.WriteDir(tmp); err != nil {
		return err
	}
	d.note(fmt.Sprintf("demo: NATS JetStream %s (stream %s), webhook %s, SMTP 127.0.0.1:%d",
		d.nats.url(), d.nats.stream, d.hook.url(), d.mail.srv.Port()))
	runID := newRunID()
	for _, name := range d.opts.Brokers {
		b, err := d.startBroker(ctx, name, runID)
		if err != nil {
			return err
		}
		d.addCloser(b.close)
		d.brokers = append(d.brokers, b)
		var dest strings.Builder
		_ = b.destination.Execute(&dest, relay.DestinationData{Topic: "<topic>"})
		d.note(fmt.Sprintf("demo: %s sink, delivering to %s", name, dest.String()))
	}

	if err := d.startRelay(ctx, tmp); err != nil {
		return err
	}
	return d.startShop(ctx)
}

// startRelay creates the sinks and runs a relay until the run ends.
func (d *run) startRelay(ctx context.Context, templatesDir string) error {
	natsSink, err := natssink.New(SinkNATS, natssink.Config{URL: d.nats.url()}, d.opts.Logger)
	if err != nil {
		return err
	}
	hookSink, err := webhook.New(SinkWebhook, webhook.Config{URL: d.hook.url(), Secret: webhookSecret, Timeout: 5 * time.Second}, d.opts.Logger)
	if err != nil {
		return errors.Join(err, natsSink.Close(ctx))
	}
	mailSink, err := email.New(SinkEmail, email.Config{
		SMTP:         email.SMTPConfig{Host: "127.0.0.1", Port: d.mail.srv.Port()},
		From:         "Herald Demo Shop <shop@example.com>",
		TemplatesDir: templatesDir,
		ToField:      "customer.email",
	}, d.opts.Logger)
	if err != nil {
		return errors.Join(err, natsSink.Close(ctx), hookSink.Close(ctx))
	}
	all := []sinks.Sink{natsSink, hookSink, mailSink}
	orderTargets := []relay.Target{
		{Sink: natsSink, Destination: template.Must(template.New("nats").Parse(natsSubjectPrefix + ".{{.Topic}}"))},
		{Sink: hookSink},
	}
	for _, b := range d.brokers {
		all = append(all, b.sink)
		orderTargets = append(orderTargets, relay.Target{Sink: b.sink, Destination: b.destination})
	}
	d.addCloser(func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range all {
			_ = s.Close(closeCtx)
		}
	})
	d.obs = newObserver()
	cfg := relay.Config{
		Tables:       d.tables,
		BatchSize:    200,
		Lease:        10 * time.Second,
		PollInterval: 250 * time.Millisecond,
		// Enough attempts to outlast the outage; the refused events die at
		// once (400 is permanent).
		MaxAttempts: int(d.opts.Outage/time.Second) + 12,
		Backoff:     relay.Backoff{Initial: 100 * time.Millisecond, Max: time.Second},
		SinkPause:   relay.Backoff{Initial: 100 * time.Millisecond, Max: time.Second},
		Logger:      d.opts.Logger,
		Observer:    d.obs,
		Routes: []relay.Route{
			{Topics: []string{"orders.*"}, Targets: orderTargets},
			{Topics: []string{"email.*"}, Targets: []relay.Target{{Sink: mailSink}}},
		},
	}
	if d.rl, err = d.db.newRelay(cfg); err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- d.rl.Run(runCtx) }()
	d.addCloser(func() {
		stop()
		if err := <-done; err != nil {
			d.note("demo: relay: " + err.Error())
		}
	})
	return nil
}

// startShop serves the order service on a free port of 127.0.0.1.
func (d *run) startShop(ctx context.Context) error {
	d.commits, d.topics = map[string]time.Time{}, map[string]string{}
	wake := d.db.polls()
	svc, err := d.db.newShop(shop.Config{Schema: d.tables.Schema, Logger: d.opts.Logger,
		OnCommit: func(c shop.Commit) {
			if wake {
				d.rl.Wake()
			}
			d.commitMu.Lock()
			defer d.commitMu.Unlock()
			for _, e := range c.Events {
				d.commits[e.ID.String()] = c.At
				d.topics[e.ID.String()] = e.Topic
			}
		}})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("starting the order service: %w", err)
	}
	d.svc = &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = d.svc.Serve(ln) }()
	d.addCloser(func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = d.svc.Shutdown(closeCtx)
	})
	d.base = "http://" + ln.Addr().String()
	d.note("demo: order service " + d.base)
	return nil
}

// drive places and pays the orders, runs the outage, waits for the dust to
// settle, fixes the webhook, replays the dead letters and waits until
// everything is delivered.
func (d *run) drive(ctx context.Context) error {
	d.phase.Store("placing orders")
	stopProgress := d.progress(ctx)
	defer stopProgress()

	// The outage starts once a fifth of the orders are paid.
	outageDone := make(chan struct{})
	go func() {
		defer close(outageDone)
		for d.paid.Load() < int64(d.opts.Orders/5) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		if d.opts.Outage == 0 {
			return
		}
		d.hook.outage.Store(true)
		d.phase.Store("webhook outage (503)")
		// The outage lasts opts.Outage from the first request it fails, so
		// that it shows even when the relay lags behind (a loaded machine).
		for d.hook.unavailable.Load() == 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(d.opts.Outage):
		}
		d.hook.outage.Store(false)
		d.phase.Store("placing orders")
	}()

	if err := d.placeOrders(ctx); err != nil {
		return err
	}
	select {
	case <-outageDone:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the outage to end: %w", ctx.Err())
	}

	// Every event is delivered or dead.
	d.phase.Store("draining")
	if err := d.waitFor(ctx, "every event to be delivered or dead-lettered", func(t deadletter.Totals) bool { return t.Undelivered() == 0 }); err != nil {
		return err
	}
	totals, err := d.dead.Totals(ctx)
	if err != nil {
		return err
	}
	d.deadLettered = totals.Dead

	// Fix the webhook and replay the dead letters.
	d.hook.fixed.Store(true)
	d.phase.Store("replaying dead letters")
	res, err := d.dead.Replay(ctx, deadletter.Filter{}, deadletter.ReplayOpts{})
	if err != nil {
		return fmt.Errorf("replaying dead letters: %w", err)
	}
	d.replayed = res.Count
	if err := d.waitFor(ctx, "the replayed events to be delivered", func(t deadletter.Totals) bool {
		return t.Undelivered() == 0 && t.Dead == 0 && d.allArrived()
	}); err != nil {
		return err
	}
	d.phase.Store("done")
	return nil
}

// placeOrders creates and pays opts.Orders orders over HTTP, at opts.Rate.
func (d *run) placeOrders(ctx context.Context) error {
	const workers = 16
	client := &shop.Client{BaseURL: d.base, HTTP: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: workers},
	}}
	jobs := make(chan int)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := d.placeOrder(ctx, client, i); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	start := time.Now()
	var err error
feed:
	for i := range d.opts.Orders {
		if d.opts.Rate > 0 {
			due := start.Add(time.Duration(float64(i) / d.opts.Rate * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
			}
		}
		select {
		case jobs <- i:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	if err != nil {
		return fmt.Errorf("placing orders: %w", err)
	}
	return nil
}

// customerNames gives the demo's customers; some need HTML escaping.
var customerNames = []string{"Ada Lovelace", "Grace Hopper", "Alan Turing", "Zoë <b>O'Brien</b> & Co", "Edsger Dijkstra",
	"Barbara Liskov", "Ken Thompson", "Margaret Hamilton", "Dennis Ritchie", "Radia Perlman"}

func (d *run) placeOrder(ctx context.Context, client *shop.Client, i int) error {
	o, err := client.Create(ctx, shop.NewOrder{
		Customer: shop.Customer{Name: customerNames[i%len(customerNames)], Email: fmt.Sprintf("customer%d@example.com", i)},
		Items: []shop.Item{
			{Name: "Outbox pattern handbook", Qty: 1 + i%3, Price: "24.90"},
			{Name: "Herald sticker", Qty: 2, Price: "1.5"},
		},
	})
	if err != nil {
		return err
	}
	if d.opts.rejected(i) {
		d.hook.reject(o.ID)
	}
	if _, err := client.Pay(ctx, o.ID); err != nil {
		return err
	}
	d.paid.Add(1)
	return nil
}

// waitFor polls the outbox until done holds.
func (d *run) waitFor(ctx context.Context, what string, done func(deadletter.Totals) bool) error {
	for {
		t, err := d.dead.Totals(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if done(t) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (%d pending, %d queued, %d dead): %w", what, t.Pending, t.Queued, t.Dead, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// routed returns how many committed events each sink should receive.
func (d *run) routed() map[string]int {
	d.commitMu.Lock()
	defer d.commitMu.Unlock()
	out := map[string]int{}
	for _, topic := range d.topics {
		for _, s := range d.sinksOf(topic) {
			out[s]++
		}
	}
	return out
}

// sinksOf is the demo's routing table.
func (d *run) sinksOf(topic string) []string {
	switch {
	case relay.MatchTopic("orders.*", topic):
		return append([]string{SinkNATS, SinkWebhook}, d.opts.Brokers...)
	case relay.MatchTopic("email.*", topic):
		return []string{SinkEmail}
	}
	return nil
}

// sinkNames lists the run's sinks in the order the summary shows them.
func (d *run) sinkNames() []string {
	return append([]string{SinkNATS, SinkWebhook, SinkEmail}, d.opts.Brokers...)
}

func (d *run) peers() map[string]*arrivals {
	peers := map[string]*arrivals{SinkNATS: d.nats.got, SinkWebhook: d.hook.got, SinkEmail: d.mail.got}
	for _, b := range d.brokers {
		peers[b.name] = b.got
	}
	return peers
}

// allArrived reports whether every sink's peer has every event routed to it.
func (d *run) allArrived() bool {
	routed := d.routed()
	for name, a := range d.peers() {
		if n, _ := a.count(); n < routed[name] {
			return false
		}
	}
	return true
}
