package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/relay/deadletter"
)

// maxShownPayload bounds the payload an event page shows: a payload may
// be megabytes, and the page would be several times that.
const maxShownPayload = 64 << 10

// keyQueueLimit bounds the deliveries shown per sink for a key.
const keyQueueLimit = 50

// payloadView is a payload as the event page shows it.
type payloadView struct {
	// Text is pretty-printed JSON, or a hex dump for bytes.
	Text string
	// Binary says Text is a hex dump.
	Binary bool
	// Length is the payload's size in bytes, and Cut says Text shows only
	// its beginning.
	Length int
	Cut    bool
	// Null is an event without a payload.
	Null bool
}

func viewPayload(e *deadletter.Event) payloadView {
	v := payloadView{Length: len(e.Payload), Null: e.Payload == nil}
	body := e.Payload
	if len(body) > maxShownPayload {
		body, v.Cut = body[:maxShownPayload], true
	}
	if e.PayloadJSON {
		var buf bytes.Buffer
		if !v.Cut && json.Indent(&buf, body, "", "  ") == nil {
			v.Text = buf.String()
		} else {
			v.Text = strings.ToValidUTF8(string(body), string(utf8.RuneError))
		}
		return v
	}
	v.Binary, v.Text = true, hex.Dump(body)
	return v
}

// deliveryRow is one sink's delivery of an event.
type deliveryRow struct {
	Sink string
	deadletter.Delivery
}

// eventData is the event page's.
type eventData struct {
	Event      *deadletter.Event
	Payload    payloadView
	Headers    [][2]string
	Deliveries []deliveryRow
	// Dead says the event has a dead letter, which replay and purge act on.
	Dead bool
	// Queues are the event's key's deliveries per sink.
	Queues []keyQueue
}

func (c *Console) event(w http.ResponseWriter, r *http.Request) {
	e, err := c.deps.DeadLetters.Show(r.Context(), r.PathValue("id"))
	var bad *deadletter.InputError
	switch {
	case errors.Is(err, deadletter.ErrNotFound):
		c.eventGone(w, r, r.PathValue("id"))
		return
	case errors.As(err, &bad):
		c.fail(w, r, http.StatusBadRequest, "", err)
		return
	case err != nil:
		c.fail(w, r, http.StatusInternalServerError, "reading the event", err)
		return
	}
	data := eventData{Event: e, Payload: viewPayload(e)}
	for k, v := range e.Headers {
		data.Headers = append(data.Headers, [2]string{k, v})
	}
	slices.SortFunc(data.Headers, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	for sink, d := range e.Deliveries {
		data.Deliveries = append(data.Deliveries, deliveryRow{Sink: sink, Delivery: d})
		data.Dead = data.Dead || d.State == deadletter.StateDead
	}
	slices.SortFunc(data.Deliveries, func(a, b deliveryRow) int { return strings.Compare(a.Sink, b.Sink) })
	if e.Key != "" {
		if data.Queues, err = c.keyQueues(r, e.Key); err != nil {
			c.fail(w, r, http.StatusInternalServerError, "reading the key's queues", err)
			return
		}
	}
	c.render(w, r, http.StatusOK, "event", "Event "+e.ID, data)
}

// goneData is the page of an event id with no row.
type goneData struct {
	ID string
	// Replayed or Purged: this console replayed or purged its dead
	// letters at At (by id).
	Replayed, Purged bool
	At               time.Time
	Retention        time.Duration
}

// eventGone answers for an event id no row has: an event this console
// replayed that has since been delivered (with retention off its row is
// deleted once every sink took it: 200, it is no error), or one it purged;
// otherwise 404, saying what leaves no row.
func (c *Console) eventGone(w http.ResponseWriter, r *http.Request, id string) {
	data := goneData{ID: id, Retention: c.deps.Retention}
	code := http.StatusNotFound
	if op, ok := c.recent.get(id); ok {
		data.Replayed, data.Purged, data.At = op.Op == "replay", op.Op == "purge", op.At
		code = http.StatusOK
	}
	title := "No event " + id
	switch {
	case data.Replayed:
		title = "Event " + id + " delivered"
	case data.Purged:
		title = "Event " + id + " purged"
	}
	c.render(w, r, code, "gone", title, data)
}

// search opens the event an id names, or the page of a key.
func (c *Console) search(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if q == "" {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	if _, err := uuid.Parse(q); err == nil {
		http.Redirect(w, r, Prefix+"event/"+url.PathEscape(q), http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, Prefix+"key?key="+url.QueryEscape(q), http.StatusSeeOther)
}

// keyData is the key page's.
type keyData struct {
	Key    string
	Queues []keyQueue
	Dead   []deadletter.DeadLetter
	// More says the key has more dead letters than the page lists.
	More    bool
	DeadURL string
}

func (c *Console) key(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	data := keyData{Key: key, DeadURL: selection{Key: key}.ListURL()}
	var err error
	if data.Queues, err = c.keyQueues(r, key); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "reading the key's queues", err)
		return
	}
	if err := c.deps.DeadLetters.List(r.Context(), deadletter.Filter{Key: key}, deadletter.ListOpts{Limit: pageSize + 1}, func(d deadletter.DeadLetter) error {
		data.Dead = append(data.Dead, d)
		return nil
	}); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "listing the key's dead letters", err)
		return
	}
	if len(data.Dead) > pageSize {
		data.Dead, data.More = data.Dead[:pageSize], true
	}
	c.render(w, r, http.StatusOK, "key", "Key "+key, data)
}
