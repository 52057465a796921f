package relaycmd

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newDLQListCommand(g *globalFlags) *cobra.Command {
	var (
		ff     filterFlags
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest event first",
		Long: `List dead letters in the order their events were written (seq), then by
sink, as a table or, with --json, a JSON array of objects: seq, id (the
event id), topic, key, sink ("" for the routing step), attempts,
created_at, died_at, last_error and stops_key (the dead letter holds back
the later events of its key on its sink until it is replayed or purged).
--limit 0 lists them all (streamed, with progress on stderr).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return usageError(fmt.Errorf("--limit: must not be negative, got %d", limit))
			}
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			s, store, done, err := g.deadLetters(cmd)
			if err != nil {
				return err
			}
			defer done()
			dw := &deadLetterWriter{w: cmd.OutOrStdout(), json: asJSON, progress: newProgress(cmd.ErrOrStderr(), "listed", 0)}
			if err := store.List(cmd.Context(), f, deadletter.ListOpts{Limit: limit}, dw.write); err != nil {
				return runtimeError(s.scrub(err))
			}
			if err := dw.finish(); err != nil {
				return runtimeError(err)
			}
			if !asJSON && dw.n == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no dead letters match")
			}
			if limit > 0 && dw.n == limit {
				fmt.Fprintf(cmd.ErrOrStderr(), "showing the first %d; use --limit 0 for all\n", limit)
			}
			return nil
		},
	}
	ff.register(cmd.Flags())
	cmd.Flags().IntVar(&limit, "limit", 100, "most dead letters to list (0 for all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}
