package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
)

const (
	// defaultListLimit and maxListLimit bound GET /dlq; page further with
	// after_seq and after_sink.
	defaultListLimit = 100
	maxListLimit     = 10000
	// dryRunSample is the most dead letters a dry run lists.
	dryRunSample = 1000
	// maxBody bounds a request body.
	maxBody = 1 << 20
)

// Selection is the body of POST /dlq/replay and /dlq/purge, mirroring the
// CLI's flags: {"ids": [], "topic": "", "key": "", "sink": "", "error": "",
// "since": "", "until": "", "older_than": "", "all": false, "all_sinks":
// false, "dry_run": false}. Give ids, a filter, or all: true. The filter
// fields select dead letters as deadletter.Filter does.
type Selection struct {
	// IDs are event ids: every dead letter of each event.
	IDs []string `json:"ids"`
	// Topic is a topic pattern (* matches any run of characters).
	Topic string `json:"topic"`
	// Key is an exact event key.
	Key string `json:"key"`
	// Sink is the exact name of the sink the dead letters failed on.
	Sink string `json:"sink"`
	// Error is a case-insensitive substring of the last error.
	Error string `json:"error"`
	// Since and Until bound the time the dead letters died (RFC 3339).
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// OlderThan selects dead letters dead for longer than this duration
	// ("24h").
	OlderThan string `json:"older_than"`
	// All selects every dead letter; it is required when nothing else is
	// given, so an empty body never replays or purges everything.
	All bool `json:"all"`
	// AllSinks (replay only) sends the events back through the routing
	// step, to every sink of their route (deadletter.ReplayOpts.AllSinks).
	AllSinks bool `json:"all_sinks"`
	// DryRun reports what would happen and changes nothing.
	DryRun bool `json:"dry_run"`
}

func (sel Selection) filter() (deadletter.Filter, error) {
	f := deadletter.Filter{IDs: sel.IDs, Topic: sel.Topic, Key: sel.Key, Sink: sel.Sink, Error: sel.Error, Since: sel.Since, Until: sel.Until}
	if sel.OlderThan != "" {
		d, err := time.ParseDuration(sel.OlderThan)
		if err != nil {
			return f, fmt.Errorf("older_than: %q is not a duration such as 24h", sel.OlderThan)
		}
		f.OlderThan = d
	}
	if err := f.Validate(); err != nil {
		return f, err
	}
	switch {
	case sel.All && !f.IsZero():
		return f, errors.New("all: cannot be combined with ids or filters")
	case !sel.All && f.IsZero():
		return f, errors.New("give ids, a filter (topic, key, sink, error, since, until, older_than), or all: true")
	}
	return f, nil
}

// OperationResult is the answer of POST /dlq/replay and /dlq/purge:
// {"dry_run": false, "count": 0, "missing": [], "dead_letters": []}.
type OperationResult struct {
	DryRun bool `json:"dry_run"`
	// Count is the number of dead letters replayed or purged (or, in a dry
	// run, that would be).
	Count int64 `json:"count"`
	// Missing are requested ids that matched no dead letter.
	Missing []string `json:"missing,omitempty"`
	// DeadLetters lists (a dry run only) up to 1,000 of the dead letters
	// that would be changed.
	DeadLetters []deadletter.DeadLetter `json:"dead_letters,omitempty"`
}

// dlqList answers GET /dlq: the dead letters matching the query, a JSON
// array of deadletter.DeadLetter ({"seq", "id", "topic", "key", "sink",
// "attempts", "created_at", "died_at", "last_error", "stops_key"}) in (seq,
// sink) order. The next page starts after the last one: after_seq=<its
// seq>&after_sink=<its sink>; after_seq alone starts after every dead
// letter of that seq.
func (s *Server) dlqList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := deadletter.Filter{IDs: q["id"], Topic: q.Get("topic"), Key: q.Get("key"), Sink: q.Get("sink"), Error: q.Get("error")}
	opts := deadletter.ListOpts{Limit: defaultListLimit}
	var err error
	parseTime := func(name string, dst *time.Time) {
		if v := q.Get(name); v != "" && err == nil {
			if *dst, err = time.Parse(time.RFC3339, v); err != nil {
				err = fmt.Errorf("%s: %q is not an RFC 3339 time", name, v)
			}
		}
	}
	parseTime("since", &f.Since)
	parseTime("until", &f.Until)
	if v := q.Get("older_than"); v != "" && err == nil {
		if f.OlderThan, err = time.ParseDuration(v); err != nil {
			err = fmt.Errorf("older_than: %q is not a duration such as 24h", v)
		}
	}
	if v := q.Get("limit"); v != "" && err == nil {
		if opts.Limit, err = strconv.Atoi(v); err != nil || opts.Limit < 1 || opts.Limit > maxListLimit {
			err = fmt.Errorf("limit: must be a number from 1 to %d", maxListLimit)
		}
	}
	if v := q.Get("after_seq"); v != "" && err == nil {
		if opts.AfterSeq, err = strconv.ParseInt(v, 10, 64); err != nil {
			err = fmt.Errorf("after_seq: %q is not a number", v)
		}
	}
	if v := q.Get("after_sink"); v != "" && err == nil {
		if q.Get("after_seq") == "" {
			err = errors.New("after_sink: needs after_seq (the seq and sink of the last dead letter of the previous page)")
		}
		opts.AfterSink = v
	}
	if err == nil {
		err = f.Validate()
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	out := []deadletter.DeadLetter{}
	if err := s.deps.DeadLetters.List(r.Context(), f, opts, func(d deadletter.DeadLetter) error {
		out = append(out, d)
		return nil
	}); err != nil {
		s.serverError(w, r, "listing dead letters", err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// dlqShow answers GET /dlq/{id}: the event as deadletter.Event, with its
// status ("pending", "queued", "dead", "done") and its deliveries by sink
// ({"state", "attempts", "error", "next_at", "queued_at", "dead_at",
// "stops_key", "head"}; sink "" is the routing step).
func (s *Server) dlqShow(w http.ResponseWriter, r *http.Request) {
	e, err := s.deps.DeadLetters.Show(r.Context(), r.PathValue("id"))
	var bad *deadletter.InputError
	switch {
	case errors.Is(err, deadletter.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		s.serverError(w, r, "showing an event", err)
	default:
		writeJSON(w, http.StatusOK, e)
	}
}

func (s *Server) dlqReplay(w http.ResponseWriter, r *http.Request) {
	s.operate(w, r, "replay", "replayed", func(sel Selection, f deadletter.Filter) (deadletter.Result, error) {
		return s.deps.DeadLetters.Replay(r.Context(), f, deadletter.ReplayOpts{AllSinks: sel.AllSinks})
	})
}

func (s *Server) dlqPurge(w http.ResponseWriter, r *http.Request) {
	s.operate(w, r, "purge", "purged", func(sel Selection, f deadletter.Filter) (deadletter.Result, error) {
		if sel.AllSinks {
			return deadletter.Result{}, errBadRequest{errors.New("all_sinks: only applies to replay")}
		}
		return s.deps.DeadLetters.Purge(r.Context(), f, deadletter.PurgeOpts{})
	})
}

type errBadRequest struct{ error }

func (s *Server) operate(w http.ResponseWriter, r *http.Request, op, done string, run func(Selection, deadletter.Filter) (deadletter.Result, error)) {
	var sel Selection
	if err := decodeBody(http.MaxBytesReader(w, r.Body, maxBody), &sel); err != nil {
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	f, err := sel.filter()
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if sel.DryRun {
		if op == "purge" && sel.AllSinks {
			writeError(w, http.StatusBadRequest, "all_sinks: only applies to replay")
			return
		}
		out := OperationResult{DryRun: true, DeadLetters: []deadletter.DeadLetter{}}
		if out.Count, err = s.deps.DeadLetters.Count(r.Context(), f); err != nil {
			s.serverError(w, r, "counting dead letters", err)
			return
		}
		if err := s.deps.DeadLetters.List(r.Context(), f, deadletter.ListOpts{Limit: dryRunSample}, func(d deadletter.DeadLetter) error {
			out.DeadLetters = append(out.DeadLetters, d)
			return nil
		}); err != nil {
			s.serverError(w, r, "listing dead letters", err)
			return
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	res, err := run(sel, f)
	var bad errBadRequest
	switch {
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, bad.Error())
		return
	case err != nil:
		// Batches before the failure are done: say how many.
		s.log.ErrorContext(r.Context(), "admin: "+op+" of dead letters failed", "done", res.Count, "error", err)
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": op + " failed; see the relay's log", "count": res.Count})
		return
	}
	s.log.InfoContext(r.Context(), "admin: dead letters "+done, "count", res.Count, "topic", sel.Topic,
		"key", sel.Key, "sink", sel.Sink, "ids", len(sel.IDs), "all", sel.All, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, OperationResult{Count: res.Count, Missing: res.Missing})
}

func (s *Server) serverError(w http.ResponseWriter, r *http.Request, doing string, err error) {
	s.log.ErrorContext(r.Context(), "admin: "+doing+" failed", "error", err)
	writeError(w, http.StatusInternalServerError, doing+" failed; see the relay's log")
}
