package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
)

// pageSize is the dead letters one page shows.
const pageSize = 50

// pageCountLimit bounds the count the dead-letter page shows ("10000+"):
// counting every match of an error-text filter reads them all. The
// confirmation of a replay or purge counts exactly.
const pageCountLimit = 10000

// selection is a dead-letter filter as the console's forms and links carry
// it: the list's query, and the hidden fields of the replay and purge
// forms.
type selection struct {
	Topic, Key, Sink, Error string
	// Since and Until are as typed: RFC 3339, or a datetime-local value
	// (2006-01-02T15:04), read as UTC.
	Since, Until string
	// IDs are the rows ticked, when the operation is on them rather than on
	// all that match.
	IDs []string
}

// timeLayouts are what the time fields accept: the browser's
// datetime-local input, with or without seconds, and RFC 3339.
var timeLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339}

func parseSelection(v url.Values) selection {
	return selection{
		Topic: strings.TrimSpace(v.Get("topic")), Key: v.Get("key"), Sink: v.Get("sink"), Error: v.Get("error"),
		Since: strings.TrimSpace(v.Get("since")), Until: strings.TrimSpace(v.Get("until")), IDs: v["id"],
	}
}

// filter turns the selection into the store's filter; a field that does
// not parse is a *deadletter.InputError naming it. (The routing step's
// dead letters cannot be selected alone: an empty sink selects every
// sink.)
func (s selection) filter() (deadletter.Filter, error) {
	f := deadletter.Filter{IDs: s.IDs, Topic: s.Topic, Key: s.Key, Sink: s.Sink, Error: s.Error}
	for _, t := range []struct {
		name string
		text string
		dst  *time.Time
	}{{"since", s.Since, &f.Since}, {"until", s.Until, &f.Until}} {
		if t.text == "" {
			continue
		}
		var err error
		for _, layout := range timeLayouts {
			if *t.dst, err = time.ParseInLocation(layout, t.text, time.UTC); err == nil {
				break
			}
		}
		if err != nil {
			return f, &deadletter.InputError{Field: t.name, Reason: fmt.Sprintf("%q is not a time such as 2026-12-01T21:30 (UTC)", t.text)}
		}
	}
	return f, f.Validate()
}

// Query encodes the filter (not the ids) for a link.
func (s selection) Query() url.Values {
	v := url.Values{}
	for _, kv := range [][2]string{{"topic", s.Topic}, {"key", s.Key}, {"sink", s.Sink}, {"error", s.Error}, {"since", s.Since}, {"until", s.Until}} {
		if kv[1] != "" {
			v.Set(kv[0], kv[1])
		}
	}
	return v
}

// OrderURL is the dead-letter page showing the selection in the given
// order ("oldest" or "newest").
func (s selection) OrderURL(order string) string {
	q := s.Query()
	q.Set("order", order)
	return Prefix + "dead?" + q.Encode()
}

// ListURL is the dead-letter page showing the selection.
func (s selection) ListURL() string {
	if q := s.Query().Encode(); q != "" {
		return Prefix + "dead?" + q
	}
	return Prefix + "dead"
}

// deadData is the dead-letter page's.
type deadData struct {
	Sel   selection
	Sinks []string
	Rows  []deadletter.DeadLetter
	Count int64
	// More says more than Count match.
	More bool
	// Oldest lists the oldest first; the newest come first by default.
	Oldest  bool
	Error   string
	NextURL string
	// Paged is true past the first page.
	Paged bool
}

func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sel := parseSelection(q)
	sel.IDs = nil
	data := deadData{Sel: sel, Sinks: c.sinkNames(nil), Rows: []deadletter.DeadLetter{}}
	data.Oldest = q.Get("order") == "oldest"
	f, err := sel.filter()
	opts := deadletter.ListOpts{Limit: pageSize + 1, Newest: !data.Oldest}
	if v := q.Get("after_seq"); v != "" && err == nil {
		if opts.AfterSeq, err = strconv.ParseInt(v, 10, 64); err != nil {
			err = &deadletter.InputError{Field: "after_seq", Reason: fmt.Sprintf("%q is not a number", v)}
		}
		opts.AfterSink = q.Get("after_sink")
		data.Paged = true
	}
	var bad *deadletter.InputError
	if err != nil {
		if !errors.As(err, &bad) {
			c.fail(w, r, http.StatusInternalServerError, "reading the filter", err)
			return
		}
		data.Error = err.Error()
		c.render(w, r, http.StatusBadRequest, "dead", "Dead letters", data)
		return
	}
	if err := c.deps.DeadLetters.List(r.Context(), f, opts, func(d deadletter.DeadLetter) error {
		data.Rows = append(data.Rows, d)
		return nil
	}); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "listing dead letters", err)
		return
	}
	if len(data.Rows) > pageSize {
		data.Rows = data.Rows[:pageSize]
		last := data.Rows[pageSize-1]
		next := sel.Query()
		if data.Oldest {
			next.Set("order", "oldest")
		}
		next.Set("after_seq", strconv.FormatInt(last.Seq, 10))
		next.Set("after_sink", last.Sink)
		data.NextURL = Prefix + "dead?" + next.Encode()
	}
	if data.Count, data.More, err = c.deps.DeadLetters.CountAtMost(r.Context(), f, pageCountLimit); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "counting dead letters", err)
		return
	}
	c.render(w, r, http.StatusOK, "dead", "Dead letters", data)
}

// operation is a replay or a purge as the forms ask for it.
type operation struct {
	// Op is "replay" or "purge".
	Op string
	// All is true for "all that match" the filter, false for the ticked
	// rows.
	All bool
	Sel selection
	// Planned is the database's time when the confirmation counted the
	// dead letters (deadletter.Store.Plan): the operation changes those
	// that died before it, the ones it counted. Zero before the
	// confirmation.
	Planned time.Time
}

// Verb is the operation as a button says it.
func (o operation) Verb() string {
	if o.Op == "purge" {
		return "Purge"
	}
	return "Replay"
}

// Hidden is the form fields that carry the operation to the next step.
func (o operation) Hidden() url.Values {
	v := o.Sel.Query()
	v.Set("op", o.Op)
	if o.All {
		v.Set("scope", "all")
	} else {
		v.Set("scope", "selected")
		v["id"] = o.Sel.IDs
	}
	if !o.Planned.IsZero() {
		v.Set("planned", o.Planned.UTC().Format(time.RFC3339Nano))
	}
	return v
}

// parseOperation reads the form of the dead-letter page ("do":
// replay-selected, purge-all, ...) or of the confirmation ("op", "scope").
func parseOperation(r *http.Request) (operation, deadletter.Filter, error) {
	o := operation{Op: r.PostFormValue("op"), All: r.PostFormValue("scope") == "all", Sel: parseSelection(r.PostForm)}
	if do := r.PostFormValue("do"); do != "" {
		op, scope, _ := strings.Cut(do, "-")
		o.Op, o.All = op, scope == "all"
	}
	if o.Op != "replay" && o.Op != "purge" {
		return o, deadletter.Filter{}, &deadletter.InputError{Field: "op", Reason: fmt.Sprintf("%q is neither replay nor purge", o.Op)}
	}
	if o.All {
		o.Sel.IDs = nil
	} else if len(o.Sel.IDs) == 0 {
		return o, deadletter.Filter{}, &deadletter.InputError{Field: "id", Reason: "no dead letter is selected: tick some rows, or choose all that match"}
	}
	f, err := o.Sel.filter()
	if err != nil {
		return o, f, err
	}
	if planned := r.PostFormValue("planned"); planned != "" {
		if o.Planned, err = time.Parse(time.RFC3339Nano, planned); err != nil {
			return o, f, &deadletter.InputError{Field: "planned", Reason: fmt.Sprintf("%q is not an RFC 3339 time", planned)}
		}
		if f.Until.IsZero() || o.Planned.Before(f.Until) {
			f.Until = o.Planned // what the confirmation counted, no more
		}
	}
	return o, f, nil
}

// confirmData is the confirmation page's.
type confirmData struct {
	operation
	// Count is the dry run's: how many dead letters the operation changes.
	Count   int64
	Sample  []deadletter.DeadLetter
	BackURL string
}

// confirmSample bounds the dead letters the confirmation lists.
const confirmSample = 20

func (c *Console) confirm(w http.ResponseWriter, r *http.Request) {
	o, f, err := parseOperation(r)
	if err != nil {
		c.badRequest(w, r, "reading the selection", err)
		return
	}
	data := confirmData{operation: o, BackURL: o.Sel.ListURL()}
	// The plan fixes what the count says: dead letters that die before the
	// operator confirms are left for another run.
	if f, data.Count, err = c.deps.DeadLetters.Plan(r.Context(), f); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "counting dead letters", err)
		return
	}
	data.Planned = f.Until
	if err := c.deps.DeadLetters.List(r.Context(), f, deadletter.ListOpts{Limit: confirmSample}, func(d deadletter.DeadLetter) error {
		data.Sample = append(data.Sample, d)
		return nil
	}); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "listing dead letters", err)
		return
	}
	c.render(w, r, http.StatusOK, "confirm", o.Verb()+" dead letters?", data)
}

// resultData is the result page's.
type resultData struct {
	operation
	Result    deadletter.Result
	BackURL   string
	Retention time.Duration
}

func (c *Console) run(w http.ResponseWriter, r *http.Request) {
	o, f, err := parseOperation(r)
	if err != nil {
		c.badRequest(w, r, "reading the selection", err)
		return
	}
	var res deadletter.Result
	if o.Op == "replay" {
		res, err = c.deps.DeadLetters.Replay(r.Context(), f, deadletter.ReplayOpts{})
	} else {
		res, err = c.deps.DeadLetters.Purge(r.Context(), f, deadletter.PurgeOpts{})
	}
	if err != nil {
		// The batches before the failure are done: say how many.
		c.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("%s (after %d dead letters)", o.Op, res.Count), err)
		return
	}
	c.recent.add(o.Op, time.Now(), without(o.Sel.IDs, res.Missing))
	c.log.InfoContext(r.Context(), "console: dead letters "+o.Op+"d", "count", res.Count, "topic", o.Sel.Topic, "key", o.Sel.Key,
		"sink", o.Sel.Sink, "error", o.Sel.Error, "ids", len(o.Sel.IDs), "all", o.All, "remote", r.RemoteAddr)
	c.render(w, r, http.StatusOK, "result", o.Verb()+" done", resultData{operation: o, Result: res, BackURL: o.Sel.ListURL(), Retention: c.deps.Retention})
}

// badRequest answers 400 for a bad field, 500 for anything else.
func (c *Console) badRequest(w http.ResponseWriter, r *http.Request, doing string, err error) {
	var bad *deadletter.InputError
	if errors.As(err, &bad) {
		c.fail(w, r, http.StatusBadRequest, doing, err)
		return
	}
	c.fail(w, r, http.StatusInternalServerError, doing, err)
}

// without is ids less those in drop.
func without(ids, drop []string) []string {
	var out []string
	for _, id := range ids {
		if !slices.Contains(drop, id) {
			out = append(out, id)
		}
	}
	return out
}
