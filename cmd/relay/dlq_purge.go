package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newDLQPurgeCommand(g *globalFlags) *cobra.Command {
	var (
		ff               filterFlags
		all, dryRun, yes bool
	)
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead-lettered events for good",
		Long: `Delete dead-lettered events for good. Holds they kept under
relay.stop_key_on_dead_letter are released and the later events of their
keys, parked behind them, are woken.

Select events with --id (repeatable), filters (--older-than 720h keeps the
last 30 days), or --all. --dry-run lists what would be deleted and changes
nothing. Without --yes, purge asks for confirmation on the terminal (and
refuses when there is none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			if err := selection(f, all); err != nil {
				return err
			}
			s, store, done, err := g.deadLetters(cmd)
			if err != nil {
				return err
			}
			defer done()
			ctx, out, errOut := cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			n, err := store.Count(ctx, f)
			if err != nil {
				return runtimeError(s.scrub(err))
			}
			if dryRun {
				if err := listAll(ctx, store, f, out, errOut, false, n); err != nil {
					return runtimeError(s.scrub(err))
				}
				fmt.Fprintf(out, "dry run: would purge %d dead events; nothing changed\n", n)
				return nil
			}
			if n == 0 {
				fmt.Fprintln(out, "no dead letters match; nothing to purge")
				return missingIDs(f.IDs)
			}
			if !yes {
				if err := confirm(os.Stdin, stdinIsTerminal(), errOut, fmt.Sprintf("Delete %d dead events for good?", n)); err != nil {
					return err
				}
			}
			p := newProgress(errOut, "purged", n)
			res, err := store.Purge(ctx, f, deadletter.PurgeOpts{Progress: p.report})
			if err != nil {
				return runtimeError(s.scrub(err))
			}
			fmt.Fprintf(out, "purged %d dead events\n", res.Count)
			return missingIDs(res.Missing)
		},
	}
	ff.register(cmd.Flags(), true, true)
	cmd.Flags().BoolVar(&all, "all", false, "purge every dead letter")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be purged; change nothing")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}
