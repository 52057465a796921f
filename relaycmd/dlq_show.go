package relaycmd

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newDLQShowCommand(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show an event: its fields, headers, payload and its state on each sink",
		Long: `Show an event, wherever it is: pending in the outbox, queued for a sink,
dead, or done (kept by relay.retention). For each sink with a delivery of it
(and the routing step, "(routing)"): its state (ready: due at its next
attempt; waiting: behind the delivery named under WAITS BEHIND, the head of
its key's queue there; dead), attempts, when it joined the queue, when it
died, whether it stops its key, and the last error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, store, done, err := g.deadLetters(cmd)
			if err != nil {
				return err
			}
			defer done()
			e, err := store.Show(cmd.Context(), args[0])
			var ie *deadletter.InputError
			switch {
			case errors.As(err, &ie):
				return usageError(err)
			case errors.Is(err, deadletter.ErrNotFound):
				return runtimeError(fmt.Errorf("no event with id %s in %s", args[0], s.outboxName()))
			case err != nil:
				return runtimeError(s.scrub(err))
			}
			if asJSON {
				b, err := json.MarshalIndent(e, "", "  ")
				if err != nil {
					return runtimeError(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return nil
			}
			return writeEvent(cmd.OutOrStdout(), e)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the event as JSON")
	return cmd
}

func writeEvent(out io.Writer, e *deadletter.Event) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	when := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	maxAttempts := "relay default"
	if e.MaxAttempts > 0 {
		maxAttempts = fmt.Sprint(e.MaxAttempts)
	}
	fmt.Fprintf(w, "id:\t%s\n", e.ID)
	fmt.Fprintf(w, "seq:\t%d\n", e.Seq)
	fmt.Fprintf(w, "topic:\t%s\n", e.Topic)
	fmt.Fprintf(w, "key:\t%s\n", orDash(e.Key))
	fmt.Fprintf(w, "status:\t%s\n", e.Status)
	fmt.Fprintf(w, "created_at:\t%s\n", when(e.CreatedAt))
	if !e.AvailableAt.IsZero() {
		fmt.Fprintf(w, "available_at:\t%s\n", when(e.AvailableAt))
	}
	if !e.FinishedAt.IsZero() {
		fmt.Fprintf(w, "finished_at:\t%s\n", when(e.FinishedAt))
	}
	fmt.Fprintf(w, "max_attempts:\t%s\n", maxAttempts)
	fmt.Fprintf(w, "content_type:\t%s\n", orDash(e.ContentType))
	if err := w.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(out, "\nheaders:")
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	if len(names) == 0 {
		fmt.Fprintln(out, "  (none)")
	}
	for _, k := range names {
		fmt.Fprintf(out, "  %s: %s\n", k, e.Headers[k])
	}

	fmt.Fprintln(out, "\ndeliveries:")
	if len(e.Deliveries) == 0 {
		switch e.Status {
		case deadletter.StatusPending:
			fmt.Fprintln(out, "  (none yet: the event has not been claimed)")
		default:
			fmt.Fprintln(out, "  (none left: delivered to every sink of its route)")
		}
	} else {
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "  SINK\tSTATE\tATTEMPTS\tNEXT ATTEMPT\tQUEUED AT\tDIED AT\tSTOPS KEY\tWAITS BEHIND\tERROR")
		sinkNames := make([]string, 0, len(e.Deliveries))
		for k := range e.Deliveries {
			sinkNames = append(sinkNames, k)
		}
		slices.Sort(sinkNames)
		for _, k := range sinkNames {
			d := e.Deliveries[k]
			stops, behind := "-", "-"
			if d.StopsKey {
				stops = "yes"
			}
			if d.Head != nil {
				behind = fmt.Sprintf("seq %d (%s, %s)", d.Head.Seq, d.Head.ID, d.Head.State)
			}
			fmt.Fprintf(w, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", sinkName(k), d.State, d.Attempts, when(d.NextAt),
				when(d.QueuedAt), when(d.DeadAt), stops, behind, orDash(cell(d.Error, 200)))
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(out, "\npayload:")
	fmt.Fprintln(out, indent(payloadText(e), "  "))
	return nil
}

// payloadText is the payload pretty-printed when it is JSON, as text when
// it is UTF-8, and base64 otherwise.
func payloadText(e *deadletter.Event) string {
	switch {
	case e.Payload == nil:
		return "null"
	case e.PayloadJSON || json.Valid(e.Payload):
		var b bytes.Buffer
		if json.Indent(&b, e.Payload, "", "  ") == nil {
			return b.String()
		}
		return string(e.Payload)
	case utf8.Valid(e.Payload):
		return string(e.Payload)
	}
	return "(binary, base64) " + base64.StdEncoding.EncodeToString(e.Payload)
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
