package relaycmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
)

func newStatusCommand(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the backlog per topic, each sink's state and backlog, and the deliveries of the last minute",
		Long: `Show what waits, per topic and per sink:

  PENDING  events in the outbox not claimed yet (due now, or delayed)
  QUEUED   deliveries waiting in a sink's queue: retrying, held while the
           sink is down, or waiting behind an earlier event of their key
  DEAD     dead letters, waiting for an operator (relay dlq)

with the age of the oldest pending event and of the oldest queued delivery
(since its event was written). Queued and dead count deliveries: an event
waiting for two sinks counts twice.

Per sink, also its state and its last minute: RETRYING deliveries wait to
be tried again after a failed attempt, DEAD 1M dead letters were recorded
in the last minute, DELIVERED 1M events it acknowledged (an estimate from
the per-minute counts relays write every few seconds). The state is the
first that holds of:

  paused    a live relay holds it paused because it is down
  failing   deliveries failed (dead letters in the last minute, or
            deliveries waiting to be retried) and none was delivered
  retrying  deliveries wait to be retried while others get through
  refusing  dead letters were recorded in the last minute while others
            got through
  flowing   nothing failed in the last minute

and, with --config, unconfigured for a sink the configuration does not
name: its deliveries are kept until it is configured again, or dropped
with relay queue drop.

The relays count deliveries by topic pattern (relay.metrics_topics), not
by topic: the last table gives the deliveries of the last minute per
pattern, an event delivered to two sinks counting twice. Then the live
relays: their configuration (a fingerprint of routes and sinks), whether
they claim (only relays with the newest configuration do) and the sinks
they hold paused because they are down. The sink "(routing)" is the
routing step, before any sink: events replayed with --all-sinks, or dead
because no route matched.

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
			if s.file != nil {
				for i := range st.Sinks {
					if x := &st.Sinks[i]; x.Sink != deadletter.RoutingStep && !slices.Contains(s.file.SinkNames(), x.Sink) {
						x.State = deadletter.SinkUnconfigured
					}
				}
			}
			if asJSON {
				b, err := json.MarshalIndent(st, "", "  ")
				if err != nil {
					return runtimeError(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return nil
			}
			if err := writeStatus(cmd.OutOrStdout(), s.outboxName(), st); err != nil {
				return err
			}
			if s.file != nil && s.file.Database.Capture == string(relay.CaptureWAL) {
				return writeCaptureStatus(cmd.Context(), cmd.OutOrStdout(), s)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// writeCaptureStatus prints the replication slot of a relay with
// database.capture: wal.
func writeCaptureStatus(ctx context.Context, out io.Writer, s *setup) error {
	pool, err := s.newPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Fprintln(out)
	sl, err := migrations.ReadSlot(ctx, pool, s.slotName())
	if errors.Is(err, migrations.ErrNoSlot) {
		_, err := fmt.Fprintf(out, "capture wal: slot %s does not exist yet (a relay creates it at its first start)\n", s.slotName())
		return err
	}
	if err != nil {
		return runtimeError(s.scrub(err))
	}
	fmt.Fprint(out, "capture wal: ")
	return writeSlot(out, sl)
}

func writeStatus(out io.Writer, table string, st *deadletter.Status) error {
	t := st.Total
	fmt.Fprintf(out, "%s at %s: %d pending, %d queued, %d dead; oldest pending %s, oldest queued %s; %s in the last minute (one per event and sink)\n",
		table, st.At.UTC().Format(time.RFC3339), t.Pending, t.Queued, t.Dead, age(t.OldestPendingAgeSeconds),
		age(t.OldestQueuedAgeSeconds), plural(st.DeliveredLastMinute, "delivery", "deliveries"))
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\nTOPIC\tPENDING\tQUEUED\tDEAD\tOLDEST PENDING\tOLDEST QUEUED\t")
	for _, x := range st.Topics {
		b := x.Backlog
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t\n", x.Topic, b.Pending, b.Queued, b.Dead,
			age(b.OldestPendingAgeSeconds), age(b.OldestQueuedAgeSeconds))
	}
	fmt.Fprintln(w, "\nSINK\tSTATE\tPENDING\tQUEUED\tRETRYING\tDEAD\tDEAD 1M\tOLDEST PENDING\tOLDEST QUEUED\tDELIVERED 1M\t")
	for _, x := range st.Sinks {
		b := x.Backlog
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%d\t\n", sinkName(x.Sink), x.State, b.Pending, b.Queued, x.Retrying,
			b.Dead, x.DeadLastMinute, age(b.OldestPendingAgeSeconds), age(b.OldestQueuedAgeSeconds), x.DeliveredLastMinute)
	}
	if len(st.Patterns) > 0 {
		fmt.Fprintln(w, "\nTOPIC PATTERN\tDELIVERED 1M\t")
		for _, p := range st.Patterns {
			fmt.Fprintf(w, "%s\t%d\t\n", p.Pattern, p.DeliveredLastMinute)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return writeRelays(out, st)
}

// plural is n with the noun's singular or plural.
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
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
