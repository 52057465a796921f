package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
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
		Long: `Show what waits, per topic and per sink:

  PENDING  events in the outbox not claimed yet (due now, or delayed)
  QUEUED   deliveries waiting in a sink's queue: retrying, held while the
           sink is down, or waiting behind an earlier event of their key
  DEAD     dead letters, waiting for an operator (relay dlq)

with the age of the oldest pending event and of the oldest queued delivery
(since its event was written), and the events published in the last minute
(an estimate from the per-minute counts relays write every few seconds).
Then the live relays: their configuration (a fingerprint of routes and
sinks), whether they claim (only relays with the newest configuration do)
and the sinks they hold paused because they are down. Queued and dead
count deliveries: an event waiting for two sinks counts
twice. The sink "(routing)" is the routing step, before any sink: events
replayed with --all-sinks, or dead because no route matched.

A sink's pending events are known only from the routes: with --config, the
pending events whose route names the sink.`,
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
			return writeStatus(cmd.OutOrStdout(), s.outboxName(), st)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func writeStatus(out io.Writer, table string, st *deadletter.Status) error {
	t := st.Total
	fmt.Fprintf(out, "%s at %s: %d pending, %d queued, %d dead; oldest pending %s, oldest queued %s; %d published in the last minute\n",
		table, st.At.UTC().Format(time.RFC3339), t.Pending, t.Queued, t.Dead, age(t.OldestPendingAgeSeconds),
		age(t.OldestQueuedAgeSeconds), t.PublishedLastMinute)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	row := func(name string, b deadletter.Backlog) {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t%d\t\n", name, b.Pending, b.Queued, b.Dead,
			age(b.OldestPendingAgeSeconds), age(b.OldestQueuedAgeSeconds), b.PublishedLastMinute)
	}
	fmt.Fprintln(w, "\nTOPIC\tPENDING\tQUEUED\tDEAD\tOLDEST PENDING\tOLDEST QUEUED\tPUBLISHED LAST MINUTE\t")
	for _, x := range st.Topics {
		row(x.Topic, x.Backlog)
	}
	fmt.Fprintln(w, "\nSINK\tPENDING\tQUEUED\tDEAD\tOLDEST PENDING\tOLDEST QUEUED\tPUBLISHED LAST MINUTE\t")
	for _, x := range st.Sinks {
		row(sinkName(x.Sink), x.Backlog)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return writeRelays(out, st)
}

// writeRelays lists the live relays: only those with the newest
// configuration claim.
func writeRelays(out io.Writer, st *deadletter.Status) error {
	if len(st.Relays) == 0 {
		_, err := fmt.Fprintln(out, "\nNo relay is running.")
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nRELAY\tWORKERS\tUP\tCONFIG\tCLAIMING\tPAUSED SINKS")
	for _, r := range st.Relays {
		claiming := "yes"
		if !r.Claiming {
			claiming = "no: a newer configuration is live"
		}
		paused := strings.Join(r.PausedSinks, ", ")
		if paused == "" {
			paused = "-"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\n", r.Relay, r.Workers, st.At.Sub(r.StartedAt).Round(time.Second), r.Config, claiming, paused)
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
