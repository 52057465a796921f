package console

import (
	"net/http"
	"slices"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
)

// Sink states, as the overview shows them.
const (
	// stateFlowing: nothing holds the sink back.
	stateFlowing = "flowing"
	// stateRetrying: some of its deliveries failed lately and wait to be
	// tried again.
	stateRetrying = "retrying"
	// statePaused: the sink is down; its events wait without spending
	// attempts.
	statePaused = "paused"
)

// overviewHeldLimit bounds the held keys the overview reads to find each
// sink's failing heads.
const overviewHeldLimit = 500

// maxShownError bounds an error text shown in a table cell: a peer's text,
// possibly long.
const maxShownError = 300

// sinkView is one sink on the overview.
type sinkView struct {
	Name  string
	State string
	// Since is when the sink was paused, or when its oldest failing
	// delivery was queued.
	Since     time.Time
	LastError string
	Delivered float64
	Failed    float64
	// Queued and OldestQueued are its queue's depth and the age of the
	// oldest event waiting in it; Dead its dead letters.
	Queued       int64
	OldestQueued float64
	Dead         int64
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
	Sinks  []sinkView
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
	data := &overviewData{At: st.At, Relays: st.Relays, Total: st.Total}
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
	backlog := map[string]deadletter.Backlog{}
	for _, s := range st.Sinks {
		backlog[s.Sink] = s.Backlog
	}
	for _, name := range c.sinkNames() {
		v := sinkView{Name: name, State: stateFlowing}
		b := backlog[name]
		v.Queued, v.OldestQueued, v.Dead = b.Queued, b.OldestQueuedAgeSeconds, b.Dead
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
				lastFailed, v.LastError = h.Since, h.LastError
			}
		}
		// The failure rate alone does not make a sink retrying: a sink
		// that was paused and came back has failures in the last minute
		// and nothing waiting to be tried again.
		if !v.Since.IsZero() {
			v.State = stateRetrying
		}
		if err := checkErrs[name]; err != nil {
			v.LastError = err.Error()
		}
		if since, ok := paused[name]; ok {
			v.State, v.Since = statePaused, since
			if err := pauseErrs[name]; err != nil {
				v.LastError = err.Error()
			}
		}
		v.LastError = clip(v.LastError, maxShownError)
		data.Sinks = append(data.Sinks, v)
	}
	return data, nil
}

// sinkNames are the configured sinks, and any other a status or history
// names (a sink dropped from the configuration still holding dead
// letters), sorted.
func (c *Console) sinkNames() []string {
	names := slices.Clone(c.deps.Sinks)
	if c.deps.Throughput != nil {
		names = append(names, c.deps.Throughput.Sinks()...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}
