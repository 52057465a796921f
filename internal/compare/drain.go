package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// stopTimeout bounds stopping a consumer, also after the run's context is
// done.
const stopTimeout = 30 * time.Second

// noopArgs are the args of River's job: a payloadSize JSON body.
type noopArgs struct {
	Payload string `json:"payload"`
}

// Kind is the job's kind.
func (noopArgs) Kind() string { return "compare_noop" }

// noopWorker works a job by counting it.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	count *counter
}

// Work counts the job.
func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	w.count.add(1)
	return nil
}

// drainRiver migrates River's tables into schema, inserts cfg.Events jobs in
// one transaction with InsertManyFastTx and times a client working them with
// the no-op worker.
func drainRiver(ctx context.Context, pool *pgxpool.Pool, schema string, cfg config, res *result) error {
	log, _ := newLogger()
	res.Workers = cfg.Workers
	res.FetchCooldownMS = millis(cfg.FetchCooldown)
	res.FetchPollIntervalMS = millis(cfg.FetchPollInterval)

	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schema, Logger: log})
	if err != nil {
		return fmt.Errorf("creating the migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating River's tables: %w", err)
	}

	count := newCounter(cfg.Events)
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{count: count})
	client, err := river.NewClient(driver, &river.Config{
		Schema:            schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.Workers}},
		FetchCooldown:     cfg.FetchCooldown,
		FetchPollInterval: cfg.FetchPollInterval,
		Workers:           workers,
		Logger:            log,
	})
	if err != nil {
		return fmt.Errorf("creating the client: %w", err)
	}

	args := noopArgs{Payload: payloadText}
	params := make([]river.InsertManyParams, cfg.Events)
	for i := range params {
		params[i] = river.InsertManyParams{Args: args}
	}
	began := time.Now()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := client.InsertManyFastTx(ctx, tx, params)
		return err
	}); err != nil {
		return fmt.Errorf("inserting %d jobs: %w", cfg.Events, err)
	}
	res.InsertSeconds = time.Since(began).Seconds()
	if err := analyzeSchema(ctx, pool, schema); err != nil {
		return err
	}

	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("starting the client: %w", err)
	}
	elapsed, waitErr := count.wait(ctx, start, nil)
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return errors.Join(waitErr, fmt.Errorf("stopping the client: %w", err))
	}
	if waitErr != nil {
		return waitErr
	}
	res.Seconds = elapsed.Seconds()

	// The clock has stopped: River's completer has written every outcome
	// once Stop returned, so its job table must agree with the count.
	var completed int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = 'completed'").Scan(&completed); err != nil {
		return fmt.Errorf("counting completed jobs: %w", err)
	}
	if completed != cfg.Events {
		return fmt.Errorf("%d of %d jobs completed in river_job after the drain", completed, cfg.Events)
	}
	return nil
}

// Watermill's topics: the SQL table the outbox writes and the forwarder
// reads, and the destination the forwarder publishes to.
const (
	outboxTopic      = "outbox"
	destinationTopic = "events"
	consumerGroup    = "compare"
)

// insertChunk is the messages per Publish call while committing the backlog:
// the SQL publisher inserts a call's messages in one statement of 3
// parameters each, and PostgreSQL takes at most 65,535 parameters.
const insertChunk = 1000

// countingPublisher is the forwarder's destination: it counts messages and
// sends them nowhere.
type countingPublisher struct {
	count *counter
}

// Publish counts msgs.
func (p countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.count.add(len(msgs))
	return nil
}

// Close does nothing.
func (countingPublisher) Close() error { return nil }

// drainWatermill creates the SQL subscriber's tables (the messages table of
// the outbox topic and its offsets table) in schema through the pool's
// search_path, publishes cfg.Events messages in one transaction through
// forwarder.NewPublisher wrapping a SQL publisher on that transaction, as
// Watermill documents the outbox, and times the forwarder moving them to a
// counting publisher.
func drainWatermill(ctx context.Context, pool *pgxpool.Pool, schema string, cfg config, res *result) error {
	log, logLevel := newLogger()
	res.BatchSize = cfg.BatchSize
	res.PollIntervalMS = millis(cfg.PollInterval)

	logger := watermill.NewSlogLogger(log)
	schemaAdapter := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: cfg.BatchSize}
	subscriber, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		ConsumerGroup:  consumerGroup,
		PollInterval:   cfg.PollInterval,
		SchemaAdapter:  schemaAdapter,
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}, logger)
	if err != nil {
		return fmt.Errorf("creating the SQL subscriber: %w", err)
	}
	defer subscriber.Close()
	if err := subscriber.SubscribeInitialize(outboxTopic); err != nil {
		return fmt.Errorf("creating the tables of topic %s: %w", outboxTopic, err)
	}

	body := payload()
	began := time.Now()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		sqlPublisher, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schemaAdapter}, logger)
		if err != nil {
			return fmt.Errorf("creating the SQL publisher: %w", err)
		}
		outbox := forwarder.NewPublisher(sqlPublisher, forwarder.PublisherConfig{ForwarderTopic: outboxTopic})
		defer outbox.Close()
		for sent := 0; sent < cfg.Events; sent += insertChunk {
			msgs := make([]*message.Message, min(insertChunk, cfg.Events-sent))
			for i := range msgs {
				msgs[i] = message.NewMessage(watermill.NewUUID(), body)
				msgs[i].SetContext(ctx)
			}
			if err := outbox.Publish(destinationTopic, msgs...); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("publishing %d messages: %w", cfg.Events, err)
	}
	res.InsertSeconds = time.Since(began).Seconds()
	if err := analyzeSchema(ctx, pool, schema); err != nil {
		return err
	}

	count := newCounter(cfg.Events)
	fwd, err := forwarder.NewForwarder(subscriber, countingPublisher{count}, logger, forwarder.Config{
		ForwarderTopic: outboxTopic,
		CloseTimeout:   stopTimeout,
	})
	if err != nil {
		return fmt.Errorf("creating the forwarder: %w", err)
	}
	var runErr error
	stopped := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		runErr = fwd.Run(ctx)
	}()
	elapsed, waitErr := count.wait(ctx, start, stopped)
	select {
	case <-stopped:
		// The forwarder stopped by itself: after a failed subscribe its
		// router's Close would wait out the whole CloseTimeout.
	default:
		if waitErr == nil {
			// The clock has stopped. The subscriber acks a batch's offset
			// after the forwarder has handled its last message; wait for
			// that before closing, or the close could cut the ack short.
			waitErr = waitAcked(ctx, pool)
		}
		if waitErr == nil {
			// Closing cancels the subscriber's queries in flight, which
			// it logs as errors.
			logLevel.Set(slog.LevelError + 1)
		}
		if err := fwd.Close(); err != nil {
			waitErr = errors.Join(waitErr, fmt.Errorf("closing the forwarder: %w", err))
		}
		<-stopped
	}
	if runErr != nil {
		waitErr = errors.Join(waitErr, fmt.Errorf("running the forwarder: %w", runErr))
	}
	if waitErr != nil {
		return waitErr
	}
	res.Seconds = elapsed.Seconds()
	return nil
}

// waitAcked waits until the consumer group's acked offset in the offsets
// table is the last message's.
func waitAcked(ctx context.Context, pool *pgxpool.Pool) error {
	messages := wsql.DefaultPostgreSQLSchema{}.MessagesTable(outboxTopic)
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{}.MessagesOffsetsTable(outboxTopic)
	query := `SELECT (SELECT max("offset") FROM ` + messages + `) = (SELECT offset_acked FROM ` + offsets + ` WHERE consumer_group = $1)`
	for {
		var acked bool
		if err := pool.QueryRow(ctx, query, consumerGroup).Scan(&acked); err != nil {
			return fmt.Errorf("reading the acked offset: %w", err)
		}
		if acked {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the last offset to be acked: %w", context.Cause(ctx))
		case <-time.After(10 * time.Millisecond):
		}
	}
}
