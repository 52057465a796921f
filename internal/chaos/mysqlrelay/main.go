// Command mysqlrelay is the chaos suite's relay process on MySQL and
// MariaDB: the engine (relay.NewMySQL) with the sinks and settings of a
// `relay run` configuration file, run until SIGINT or SIGTERM, then the
// batch in flight finished, the sinks closed and exit 0. The suite runs
// it where it runs `relay run` on PostgreSQL, because `relay run` does not
// serve a mysql:// database yet (issue 18); it is test machinery, never
// shipped.
//
//	mysqlrelay --config relay.yaml
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/relayconfig"
)

// closeTimeout bounds the flushing of sinks after the relay stopped.
const closeTimeout = 30 * time.Second

func main() {
	config := flag.String("config", "", "the relay's YAML configuration; its database.url a mysql:// URL")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, *config)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mysqlrelay:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, path string) error {
	file, err := relayconfig.Load(path, os.LookupEnv)
	if err != nil {
		return err
	}
	logger := file.Log.NewLogger(os.Stderr)
	built, err := file.Build(ctx, logger)
	if err != nil {
		return err
	}
	closeSinks := func() error {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		return built.Close(closeCtx)
	}
	built.Config.Tables = file.Tables()
	db, err := relay.OpenMySQL(file.DatabaseURL(), built.Config.WithDefaults().Workers)
	if err != nil {
		return errors.Join(err, closeSinks())
	}
	defer db.Close()
	r, err := relay.NewMySQL(db, built.Config)
	if err != nil {
		return errors.Join(fmt.Errorf("starting the relay: %w", err), closeSinks())
	}
	runErr := r.Run(ctx)
	if err := closeSinks(); err != nil {
		return errors.Join(runErr, err)
	}
	if runErr != nil {
		return runErr
	}
	logger.Info("relay: sinks closed; exiting")
	return nil
}
