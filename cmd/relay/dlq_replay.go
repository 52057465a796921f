package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newDLQReplayCommand(g *globalFlags) *cobra.Command {
	var (
		ff                         filterFlags
		all, allSinks, dryRun, yes bool
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Make dead-lettered events pending again, for the sinks that failed",
		Long: `Make dead-lettered events pending again: same id and seq, attempts 0, due
now. Only the sinks that did not deliver an event get it again, unless
--all-sinks. Events of one key go out again in seq order. Holds the event
kept under relay.stop_key_on_dead_letter are released and the later events
of its key, parked behind it, are woken.

Select events with --id (repeatable), filters, or --all. --dry-run lists what
would be replayed and changes nothing. Without --yes, replay asks for
confirmation on the terminal (and refuses when there is none).`,
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
			to := "to the sinks that did not deliver them"
			if allSinks {
				to = "to every sink of their route"
			}
			if dryRun {
				if err := listAll(ctx, store, f, out, errOut, false, n); err != nil {
					return runtimeError(s.scrub(err))
				}
				fmt.Fprintf(out, "dry run: would replay %d dead events %s; nothing changed\n", n, to)
				return nil
			}
			if n == 0 {
				fmt.Fprintln(out, "no dead letters match; nothing to replay")
				return missingIDs(f.IDs)
			}
			if !yes {
				if err := confirm(os.Stdin, stdinIsTerminal(), errOut, fmt.Sprintf("Replay %d dead events %s?", n, to)); err != nil {
					return err
				}
			}
			p := newProgress(errOut, "replayed", n)
			res, err := store.Replay(ctx, f, deadletter.ReplayOpts{AllSinks: allSinks, Progress: p.report})
			if err != nil {
				return runtimeError(s.scrub(err))
			}
			fmt.Fprintf(out, "replayed %d dead events %s\n", res.Count, to)
			return missingIDs(res.Missing)
		},
	}
	ff.register(cmd.Flags(), true, false)
	cmd.Flags().BoolVar(&all, "all", false, "replay every dead letter")
	cmd.Flags().BoolVar(&allSinks, "all-sinks", false, "send to every sink again, including those that delivered")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be replayed; change nothing")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// missingIDs fails when requested ids were not (matching) dead letters.
func missingIDs(missing []string) error {
	if len(missing) == 0 {
		return nil
	}
	return runtimeError(fmt.Errorf("%d of the given ids are not dead letters matching the filters: %s", len(missing), strings.Join(missing, ", ")))
}
