package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newStatusCommand(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the backlog per topic and per sink, and what was published in the last minute",
		Long: `Show the backlog of the outbox table per topic and per sink: pending events
(waiting, including retries and delayed events, or being published), dead
letters, the age of the oldest pending event, and the
events published in the last minute (an estimate from the per-minute counts
relays write every few seconds).

A sink's pending events are those it has not delivered: from the events'
deliveries, or, with --config, from the routes (which also counts events no
sink has tried yet).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, store, done, err := g.deadLetters(cmd)
			if err != nil {
				return err
			}
			defer done()
			var routes deadletter.RouteFunc
			if s.file != nil {
				routes = s.file.RouteSinks
			}
			st, err := store.Status(cmd.Context(), routes)
			if err != nil {
				return runtimeError(s.scrub(err))
			}
			if asJSON {
				b, err := json.MarshalIndent(st, "", "  ")
				if err != nil {
					return runtimeError(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return nil
			}
			return writeStatus(cmd.OutOrStdout(), s.tables.Outbox(), st)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func writeStatus(out io.Writer, table string, st *deadletter.Status) error {
	t := st.Total
	fmt.Fprintf(out, "%s at %s: %d pending, %d dead; oldest pending %s; %d published in the last minute\n",
		table, st.At.UTC().Format(time.RFC3339), t.Pending, t.Dead, age(t.OldestPendingAgeSeconds), t.PublishedLastMinute)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\nTOPIC\tPENDING\tDEAD\tOLDEST PENDING\tPUBLISHED/1M\t")
	for _, x := range st.Topics {
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%d\t\n", x.Topic, x.Pending, x.Dead, age(x.OldestPendingAgeSeconds), x.PublishedLastMinute)
	}
	fmt.Fprintln(w, "\nSINK\tPENDING\tDEAD\tOLDEST PENDING\tPUBLISHED/1M\t")
	for _, x := range st.Sinks {
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%d\t\n", x.Sink, x.Pending, x.Dead, age(x.OldestPendingAgeSeconds), x.PublishedLastMinute)
	}
	return w.Flush()
}

// age prints seconds as a rounded duration, "-" for none.
func age(seconds float64) string {
	if seconds <= 0 {
		return "-"
	}
	return (time.Duration(seconds * float64(time.Second))).Round(time.Second).String()
}
