package relaycmd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newDLQCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, replay and purge dead letters",
		Long: `List, show, replay and purge dead letters. A dead letter is an event that
failed for good on one sink: an event that failed on two sinks is two dead
letters. Events that matched no route, or could not be read, die at the
routing step, before any sink (shown as sink "(routing)").

Filters select dead letters by --topic (a pattern: * matches any run of
characters), --key, --sink (the sink it failed on), --error (a substring of
its last error, any case), --since/--until (when it died: an RFC 3339
time, or a duration meaning that long ago, e.g. 24h), --older-than (died
more than that long ago) and --id (repeatable). list, replay and purge take
the same filters, so a dry run lists exactly what would change.

Every command walks the dead letters in batches of 1,000, each its own short
transaction, so it works on any number of them. Replay and purge lock every
lane for the length of a batch: relays wait for the batch, and it waits for
the batches relays are recording.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newDLQListCommand(g), newDLQShowCommand(g), newDLQReplayCommand(g), newDLQPurgeCommand(g))
	return cmd
}

// filterFlags are the dead-letter filters the dlq commands share.
type filterFlags struct {
	ids                           []string
	topic, key, sink, errContains string
	since, until                  string
	olderThan                     time.Duration
}

// register adds the selection flags. list, replay and purge take the same
// ones, so a selection that lists something replays or purges exactly that.
func (f *filterFlags) register(fs *pflag.FlagSet) {
	fs.StringArrayVar(&f.ids, "id", nil, "event id (repeatable)")
	fs.StringVar(&f.topic, "topic", "", "topic pattern (* matches any run of characters)")
	fs.StringVar(&f.key, "key", "", "event key")
	fs.StringVar(&f.sink, "sink", "", "sink the dead letter failed on")
	fs.StringVar(&f.errContains, "error", "", "substring of the last error (any case)")
	fs.StringVar(&f.since, "since", "", "died at or after: RFC 3339 time or a duration ago (24h)")
	fs.StringVar(&f.until, "until", "", "died before: RFC 3339 time or a duration ago (1h)")
	fs.DurationVar(&f.olderThan, "older-than", 0, "died more than this long ago (e.g. 720h)")
}

// filter returns the deadletter filter; errors are usage errors.
func (f *filterFlags) filter(now time.Time) (deadletter.Filter, error) {
	out := deadletter.Filter{IDs: f.ids, Topic: f.topic, Key: f.key, Sink: f.sink, Error: f.errContains, OlderThan: f.olderThan}
	var err error
	if out.Since, err = parseWhen("--since", f.since, now); err != nil {
		return out, usageError(err)
	}
	if out.Until, err = parseWhen("--until", f.until, now); err != nil {
		return out, usageError(err)
	}
	if f.olderThan < 0 {
		return out, usageError(fmt.Errorf("--older-than: must not be negative, got %s", f.olderThan))
	}
	if err := out.Validate(); err != nil {
		var ie *deadletter.InputError
		if errors.As(err, &ie) {
			return out, usageError(fmt.Errorf("--%s: %s", strings.ReplaceAll(ie.Field, "_", "-"), ie.Reason))
		}
		return out, usageError(err)
	}
	return out, nil
}

// parseWhen reads an RFC 3339 time or a duration before now.
func parseWhen(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s: %q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration ago (24h)", flag, v)
}

// selection checks that a replay or purge selects something explicitly.
func selection(f deadletter.Filter, all bool) error {
	switch {
	case all && !f.IsZero():
		return usageError(errors.New("--all: cannot be combined with --id or filters"))
	case !all && f.IsZero():
		return usageError(errors.New("select dead letters with --id, a filter (--topic, --key, --sink, --error, --since, --until, --older-than) or --all"))
	}
	return nil
}

// deadLetters connects and returns the store of the selected tables, and a
// function releasing the connection.
func (g *globalFlags) deadLetters(cmd *cobra.Command) (*setup, *deadletter.Store, func(), error) {
	s, err := g.loadRead(false)
	if err != nil {
		return nil, nil, nil, err
	}
	db, err := s.connect(cmd.Context())
	if err != nil {
		return nil, nil, nil, err
	}
	if err := db.checkSchema(cmd.Context(), s.tables); err != nil {
		db.Close()
		return nil, nil, nil, runtimeError(s.scrub(err))
	}
	store, err := db.deadLetters(s.tables)
	if err != nil {
		db.Close()
		return nil, nil, nil, usageError(err)
	}
	return s, store, db.Close, nil
}

// confirm asks question on out and reads the answer from in. Without a
// terminal it refuses: a script must say --yes.
func confirm(in io.Reader, terminal bool, out io.Writer, question string) error {
	if !terminal {
		return usageError(fmt.Errorf("%s: standard input is not a terminal to confirm on; pass --yes", question))
	}
	fmt.Fprintf(out, "%s [y/N] ", question)
	answer, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && answer == "" {
		return usageError(fmt.Errorf("%s: no answer (%v); nothing changed", question, err))
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return usageError(errors.New("not confirmed; nothing changed"))
}

// progress prints running totals to w at most once a second (and always
// the last), for operations on many rows. The total is the plan's count; a
// dead letter that died before the count in a transaction committed after
// it is changed too (deadletter.Store.Plan), so the total rises to what was
// done rather than the progress passing 100 %.
type progress struct {
	w     io.Writer
	verb  string
	total int64
	last  time.Time
	start time.Time
}

func newProgress(w io.Writer, verb string, total int64) *progress {
	return &progress{w: w, verb: verb, total: total, start: time.Now()}
}

func (p *progress) report(done int64) {
	if done < p.total && time.Since(p.last) < time.Second {
		return
	}
	p.last = time.Now()
	if p.total > 0 {
		p.total = max(p.total, done)
		fmt.Fprintf(p.w, "%s %d/%s (%.0f%%, %s)\n", p.verb, done, deadLetters(p.total), 100*float64(done)/float64(p.total), time.Since(p.start).Round(time.Millisecond))
		return
	}
	fmt.Fprintf(p.w, "%s %s (%s)\n", p.verb, deadLetters(done), time.Since(p.start).Round(time.Millisecond))
}

// deadLetterWriter prints dead letters as a table or a JSON array, one at a
// time: memory does not grow with their number.
type deadLetterWriter struct {
	w        io.Writer
	json     bool
	n        int
	progress *progress
}

func (d *deadLetterWriter) write(dl deadletter.DeadLetter) error {
	if d.json {
		b, err := json.Marshal(dl)
		if err != nil {
			return err
		}
		sep := ",\n"
		if d.n == 0 {
			sep = "[\n"
		}
		if _, err := fmt.Fprintf(d.w, "%s%s", sep, b); err != nil {
			return err
		}
	} else {
		if d.n == 0 {
			fmt.Fprintf(d.w, "%-36s  %-16s  %-24s  %-16s  %-20s  %4s  %-5s  %s\n", "ID", "SINK", "TOPIC", "KEY", "DIED AT", "ATT", "STOPS", "LAST ERROR")
		}
		stops := "-"
		if dl.StopsKey {
			stops = "key"
		}
		if _, err := fmt.Fprintf(d.w, "%-36s  %-16s  %-24s  %-16s  %-20s  %4d  %-5s  %s\n", dl.ID, cell(sinkName(dl.Sink), 16), cell(dl.Topic, 24),
			cell(dl.Key, 16), dl.DiedAt.UTC().Format(time.RFC3339), dl.Attempts, stops, cell(cause(dl), 100)); err != nil {
			return err
		}
	}
	d.n++
	if d.progress != nil && d.n%10000 == 0 {
		d.progress.report(int64(d.n))
	}
	return nil
}

// finish closes the JSON array (an empty one when nothing was written).
func (d *deadLetterWriter) finish() error {
	if !d.json {
		return nil
	}
	var err error
	if d.n == 0 {
		_, err = fmt.Fprintln(d.w, "[]")
	} else {
		_, err = fmt.Fprintln(d.w, "\n]")
	}
	return err
}

// sinkName names a sink for people: the routing step ("") as "(routing)".
func sinkName(s string) string {
	if s == deadletter.RoutingStep {
		return "(routing)"
	}
	return s
}

// cause is a dead letter's last error without the prefix naming its
// event and sink, which the table shows in other columns. The JSON output
// and dlq show keep the whole text.
func cause(dl deadletter.DeadLetter) string { return deadletter.Cause(dl.ID, dl.LastError) }

// cell fits s on one line of at most n characters.
func cell(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if s == "" {
		return "-"
	}
	r := []rune(s)
	if len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// listAll writes every dead letter matching f (a dry run's "what would
// change"), with progress on errOut.
func listAll(ctx context.Context, store *deadletter.Store, f deadletter.Filter, out, errOut io.Writer, asJSON bool, total int64) error {
	dw := &deadLetterWriter{w: out, json: asJSON, progress: newProgress(errOut, "listed", total)}
	if err := store.List(ctx, f, deadletter.ListOpts{}, dw.write); err != nil {
		return err
	}
	return dw.finish()
}

// bulkChange is a dead-letter command that changes every selected dead
// letter in batches: replay or purge. Both select, count, list on
// --dry-run, confirm unless --yes, then apply with progress.
type bulkChange struct {
	ff               filterFlags
	all, dryRun, yes bool
	// verb and done name the change ("replay", "replayed").
	verb, done string
	// scope ends the messages about the dead letters (" through the
	// routing step…"); it may be empty.
	scope func() string
	// question asks for confirmation of a change to n dead letters.
	question func(n int64) string
	apply    func(ctx context.Context, store *deadletter.Store, f deadletter.Filter, progress func(int64)) (deadletter.Result, error)
}

// register adds --all, --dry-run and --yes.
func (b *bulkChange) register(fs *pflag.FlagSet) {
	fs.BoolVar(&b.all, "all", false, b.verb+" every dead letter")
	fs.BoolVar(&b.dryRun, "dry-run", false, "list what would be "+b.done+"; change nothing")
	fs.BoolVarP(&b.yes, "yes", "y", false, "do not ask for confirmation")
}

func (b *bulkChange) run(cmd *cobra.Command, g *globalFlags) error {
	f, err := b.ff.filter(time.Now())
	if err != nil {
		return err
	}
	if err := selection(f, b.all); err != nil {
		return err
	}
	s, store, done, err := g.deadLetters(cmd)
	if err != nil {
		return err
	}
	defer done()
	ctx, out, errOut := cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	// The plan fixes the selection to the dead letters counted now: those
	// that die while the operator confirms or the batches run (a sink
	// still refusing events, a replayed event failing again) are left for
	// another run, and the progress counts up to n.
	f, n, err := store.Plan(ctx, f)
	if err != nil {
		return runtimeError(s.scrub(err))
	}
	scope := b.scope()
	if b.dryRun {
		if err := listAll(ctx, store, f, out, errOut, false, n); err != nil {
			return runtimeError(s.scrub(err))
		}
		fmt.Fprintf(out, "dry run: would %s %s%s; nothing changed\n", b.verb, deadLetters(n), scope)
		return nil
	}
	if n == 0 {
		fmt.Fprintf(out, "no dead letters match; nothing to %s\n", b.verb)
		return missingIDs(f.IDs)
	}
	if !b.yes {
		if err := confirm(os.Stdin, stdinIsTerminal(), errOut, b.question(n)); err != nil {
			return err
		}
	}
	p := newProgress(errOut, b.done, n)
	res, err := b.apply(ctx, store, f, p.report)
	if err != nil {
		return runtimeError(s.scrub(err))
	}
	late := ""
	if extra := res.Count - n; extra > 0 {
		late = fmt.Sprintf(" (%d more than counted: dead before the count, committed after it)", extra)
	}
	fmt.Fprintf(out, "%s %s%s%s\n", b.done, deadLetters(res.Count), scope, late)
	return missingIDs(res.Missing)
}

// deadLetters counts dead letters in words: "1 dead letter", "2 dead letters".
func deadLetters[N int | int64](n N) string {
	if n == 1 {
		return "1 dead letter"
	}
	return fmt.Sprintf("%d dead letters", n)
}

// missingIDs fails when requested ids were not (matching) dead letters.
func missingIDs(missing []string) error {
	if len(missing) == 0 {
		return nil
	}
	return runtimeError(fmt.Errorf("%d of the given ids have no dead letter matching the filters: %s", len(missing), strings.Join(missing, ", ")))
}
