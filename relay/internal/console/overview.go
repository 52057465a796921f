package console

import (
	"net/http"
	"slices"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
)

// overviewHeldLimit bounds the held keys the overview reads to find each
// sink's failing heads.
const overviewHeldLimit = 500

// maxShownError bounds an error text shown in a table cell: a peer's text,
// possibly long.
const maxShownError = 300

// sinkView is one sink on the overview.
type sinkView struct {
	Name string
	// State is one of deadletter's Sink states: the database's view of
	// the sink's last minute, over every relay (deadletter.Status), paused
	// also when this relay holds it paused.
	State string
	// Since is when the sink was paused, or when its oldest failing
	// delivery was queued.
	Since     time.Time
	LastError string
	// Delivered and Failed are this relay's deliveries and failed
	// deliveries per second over the last minute.
	Delivered float64
	Failed    float64
	// Queued and OldestQueued are its queue's depth and the age of the
	// oldest event waiting in it; Dead its dead letters, DeadLastMinute
	// those recorded in the last minute.
	Queued         int64
	OldestQueued   float64
	Dead           int64
	DeadLastMinute int64
	// HeldKeys counts keys held back on the sink (up to what the overview
	// reads).
	HeldKeys int
	Chart    chartView
}

// overviewData is the overview's.
type overviewData struct {
	At     time.Time
	Relays []deadletter.RelayStatus
	Total  deadletter.Backlog
	// Delivered counts the deliveries of the last minute, every sink's.
	Delivered int64
	Sinks     []sinkView
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	c.renderOverview(w, r, "layout")
}

// overviewLive answers the live refresh: the overview's body alone.
func (c *Console) overviewLive(w http.ResponseWriter, r *http.Request) {
	c.renderOverview(w, r, "body")
}

func (c *Console) renderOverview(w http.ResponseWriter, r *http.Request, tmpl string) {
	data, err := c.readOverview(r)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "reading the status", err)
		return
	}
	c.renderTemplate(w, r, http.StatusOK, "overview", tmpl, "Overview", data)
}

func (c *Console) readOverview(r *http.Request) (*overviewData, error) {
	st, err := c.deps.DeadLetters.Status(r.Context(), c.deps.Routes)
	if err != nil {
		return nil, err
	}
	held, err := c.deps.DeadLetters.HeldKeys(r.Context(), overviewHeldLimit)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	data := &overviewData{At: st.At, Relays: st.Relays, Total: st.Total, Delivered: st.DeliveredLastMinute}
	var paused map[string]time.Time
	if c.deps.PausedSinks != nil {
		paused = c.deps.PausedSinks()
	}
	var pauseErrs, checkErrs map[string]error
	if c.deps.PauseErrors != nil {
		pauseErrs = c.deps.PauseErrors()
	}
	if c.deps.SinkErrors != nil {
		checkErrs = c.deps.SinkErrors()
	}
	status := map[string]deadletter.SinkStatus{}
	for _, s := range st.Sinks {
		status[s.Sink] = s
	}
	for _, name := range c.sinkNames(st.Sinks) {
		s, ok := status[name]
		switch {
		case !ok:
			s.State = deadletter.SinkFlowing // nothing of it in the database
		case len(c.deps.Sinks) > 0 && !slices.Contains(c.deps.Sinks, name):
			// Deliveries wait for a sink the relay does not know: kept
			// until it is configured again or dropped.
			s.State = deadletter.SinkUnconfigured
		}
		v := sinkView{Name: name, State: s.State, Queued: s.Queued, OldestQueued: s.OldestQueuedAgeSeconds,
			Dead: s.Dead, DeadLastMinute: s.DeadLastMinute}
		if c.deps.Throughput != nil {
			v.Delivered, v.Failed = c.deps.Throughput.Rates(name, now)
			v.Chart = chart(c.deps.Throughput.Series(name, now))
		}
		var lastFailed time.Time
		for _, h := range held {
			if h.Sink != name {
				continue
			}
			v.HeldKeys++
			if h.HeadState != deadletter.StateReady {
				continue
			}
			if v.Since.IsZero() || h.Since.Before(v.Since) {
				v.Since = h.Since
			}
			if h.Since.After(lastFailed) || v.LastError == "" {
				lastFailed, v.LastError = h.Since, deadletter.Cause(h.HeadID, h.LastError)
			}
		}
		if err := checkErrs[name]; err != nil {
			v.LastError = deadletter.Cause("", err.Error())
		}
		if since, ok := paused[name]; ok {
			v.State, v.Since = deadletter.SinkPaused, since
			if err := pauseErrs[name]; err != nil {
				v.LastError = deadletter.Cause("", err.Error())
			}
		}
		if v.LastError == "" && s.DeadLastMinute > 0 {
			// A sink refusing events for good has no failing head to
			// show: its newest dead letter of the last minute says why.
			if v.LastError, err = c.newestDeadError(r, name, st.At.Add(-time.Minute)); err != nil {
				return nil, err
			}
		}
		v.LastError = clip(v.LastError, maxShownError)
		data.Sinks = append(data.Sinks, v)
	}
	return data, nil
}

// newestDeadError is the cause of sink's newest dead letter that died
// since then, "" when there is none. Read only for a sink with dead
// letters in the last minute, usually of its newest events: the walk from
// the newest end of the dead-letter index stops at the first.
func (c *Console) newestDeadError(r *http.Request, sink string, since time.Time) (string, error) {
	var msg string
	err := c.deps.DeadLetters.List(r.Context(), deadletter.Filter{Sink: sink, Since: since}, deadletter.ListOpts{Limit: 1, Newest: true},
		func(d deadletter.DeadLetter) error {
			msg = deadletter.Cause(d.ID, d.LastError)
			return nil
		})
	return msg, err
}

// sinkNames are the configured sinks, and any other a status or history
// names (a sink dropped from the configuration still holding dead
// letters), sorted.
func (c *Console) sinkNames(inDatabase []deadletter.SinkStatus) []string {
	names := slices.Clone(c.deps.Sinks)
	if c.deps.Throughput != nil {
		names = append(names, c.deps.Throughput.Sinks()...)
	}
	for _, s := range inDatabase {
		if s.Sink != deadletter.RoutingStep && s.Queued+s.Dead > 0 {
			names = append(names, s.Sink)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}
