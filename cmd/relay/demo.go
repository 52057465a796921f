package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/examples/orders/demo"
	"github.com/heraldhq/herald/relay/relayconfig"
)

func newDemoCommand(g *globalFlags) *cobra.Command {
	var (
		opts    demo.Options
		asJSON  bool
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the orders example end to end in one process (needs only PostgreSQL)",
		Long: `Run Herald's orders example end to end in this process: an order service
commits orders and their events in one transaction, and a relay fans them out
to an embedded NATS JetStream server, a webhook receiver and an SMTP server.
The webhook fails for a while (HTTP 503, retried) and refuses a few events
(HTTP 400, dead-lettered); the demo then fixes it, replays the dead letters
and prints what reached every sink, with commit-to-publish latencies.

Only PostgreSQL is needed: --database-url, else DATABASE_URL, else
` + demo.DefaultDatabaseURL + `. When none answers and a
Docker engine does, a throwaway PostgreSQL container is started. The demo
works in its own schema (--schema, default ` + demo.DefaultSchema + `), dropped
before and after the run unless --keep.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.DatabaseURL = g.databaseURL
			if opts.DatabaseURL == "" {
				opts.DatabaseURL = os.Getenv("DATABASE_URL")
			}
			opts.Schema = g.schema
			if cmd.Flags().Changed("outage") && opts.Outage == 0 {
				opts.Outage = -1 // asked for no outage
			}
			if g.config != "" || g.table != "" {
				return usageError(errors.New("demo: --config and --table do not apply (the demo configures itself)"))
			}
			opts.Progress = cmd.ErrOrStderr()
			if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && cmd.ErrOrStderr() == os.Stderr {
				opts.Live = true
			}
			if verbose {
				opts.Logger = relayconfig.Log{Level: "warn"}.NewLogger(cmd.ErrOrStderr())
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			sum, err := demo.Run(ctx, opts)
			if err != nil {
				var noDB *demo.NoDatabaseError
				if errors.As(err, &noDB) {
					return runtimeError(err)
				}
				return runtimeError(fmt.Errorf("demo: %w", err))
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(sum); err != nil {
					return runtimeError(err)
				}
			} else {
				sum.Print(cmd.OutOrStdout())
			}
			if err := sum.Check(); err != nil {
				return runtimeError(fmt.Errorf("demo: the numbers do not add up:\n%w", err))
			}
			if !asJSON {
				fmt.Fprintln(cmd.OutOrStdout(), "\nOK: every event reached every sink its route names.")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Orders, "orders", 0, "orders to place and pay (default 500, 100 with --short)")
	f.Float64Var(&opts.Rate, "rate", 0, "orders per second (default 100; negative: as fast as possible)")
	f.DurationVar(&opts.Outage, "outage", 0, "how long the webhook answers 503 (default 3s, 1s with --short; 0 for none)")
	f.BoolVar(&opts.Short, "short", false, "a quick run, for CI")
	f.BoolVar(&opts.Keep, "keep", false, "keep the demo schema (orders, outbox) at the end")
	f.DurationVar(&opts.Timeout, "timeout", 3*time.Minute, "give up after this long")
	f.BoolVar(&asJSON, "json", false, "print the summary as JSON")
	f.BoolVarP(&verbose, "verbose", "v", false, "print the relay's warnings (each failed delivery)")
	return cmd
}
