package relay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/routefilter"
	"github.com/heraldhq/herald/sinks"
)

// whereFilter compiles expr for a test route.
func whereFilter(t testing.TB, expr string) *routefilter.Filter {
	t.Helper()
	f, err := CompileWhere(expr)
	if err != nil {
		t.Fatalf("compiling %q: %v", expr, err)
	}
	return f
}

// insertRaw commits one event with the given payload columns and headers
// and returns its id.
func (b *testBundle) insertRaw(t testing.TB, topic, key string, payload *string, payloadBin []byte, headers string) string {
	t.Helper()
	var id string
	err := b.pool.QueryRow(context.Background(), `INSERT INTO `+b.tables.Outbox()+` (topic, key, payload, payload_bin, headers)
VALUES ($1, NULLIF($2, ''), $3::json, $4, $5::jsonb) RETURNING id::text`, topic, key, payload, payloadBin, headers).Scan(&id)
	if err != nil {
		t.Fatalf("inserting an event: %v", err)
	}
	return id
}

func jsonText(s string) *string { return &s }

// deadReason returns the last error of event id's dead letter on sink,
// "" while it has none.
func (b *testBundle) deadReason(t testing.TB, id, sink string) string {
	t.Helper()
	var reason string
	err := b.pool.QueryRow(context.Background(), `SELECT coalesce(max(last_error), '') FROM `+b.tables.Deliveries()+`
WHERE state = 'dead' AND sink = $2 AND id = $1::uuid`, id, sink).Scan(&reason)
	if err != nil {
		t.Fatalf("reading the dead letter of %s: %v", id, err)
	}
	return reason
}

// idsAt returns the ids sink received, in order of arrival.
func idsAt(b *testBundle, sink string) []string {
	var ids []string
	for _, g := range b.rec.forSink(sink) {
		ids = append(ids, g.id)
	}
	return ids
}

// TestWhereRoutesByFilter shows two routes on one topic with different
// filters sending events to different sinks, the first matching route
// winning; an event no filter matches, and one on which the filters fail,
// dead-lettered at the routing step like an unrouted event, saying why;
// and a retry of a filtered event going back to the sink its route names.
//
// PostgreSQL only, as the other filter tests: filters are the engine's
// routing, whatever the store; the rows are inserted with PostgreSQL's SQL.
func TestWhereRoutesByFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var failedOnce = map[string]bool{}
	big := &testSink{name: "big", rec: b.rec, fail: func(e sinks.Event) error {
		if !failedOnce[e.ID] { // every event's first attempt fails: retries re-route
			failedOnce[e.ID] = true
			return errBoom
		}
		return nil
	}}
	small := &testSink{name: "small", rec: b.rec}
	cfg := b.config(t)
	cfg.Routes = []Route{
		{Topics: []string{"orders.*"}, Where: whereFilter(t, `payload.total > 100 && headers["tenant"] == "acme"`), Targets: []Target{{Sink: big}}},
		{Topics: []string{"orders.*"}, Where: whereFilter(t, `payload.total > 0`), Targets: []Target{{Sink: small}}},
	}
	acmeBig := b.insertRaw(t, "orders.created", "k1", jsonText(`{"total": 150}`), nil, `{"tenant": "acme"}`)
	otherBig := b.insertRaw(t, "orders.created", "k2", jsonText(`{"total": 150}`), nil, `{"tenant": "globex"}`)
	acmeSmall := b.insertRaw(t, "orders.created", "k3", jsonText(`{"total": 50}`), nil, `{"tenant": "acme"}`)
	zero := b.insertRaw(t, "orders.created", "k4", jsonText(`{"total": 0}`), nil, `{}`)
	noTotal := b.insertRaw(t, "orders.created", "k5", jsonText(`{"sum": 7}`), nil, `{"tenant": "acme"}`)
	r, err := NewPostgres(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, time.Minute, "the matched events delivered and the others dead", func() bool {
		return len(b.rec.forSink("big")) == 1 && len(b.rec.forSink("small")) == 2 &&
			b.deadReason(t, zero, "") != "" && b.deadReason(t, noTotal, "") != ""
	})
	if got := idsAt(b, "big"); !slices.Equal(got, []string{acmeBig}) {
		t.Errorf("big received %v, want only %s (the first route wins over the second, which matches it too)", got, acmeBig)
	}
	if got := idsAt(b, "small"); !slices.Contains(got, otherBig) || !slices.Contains(got, acmeSmall) {
		t.Errorf("small received %v, want %s and %s", got, otherBig, acmeSmall)
	}
	if reason := b.deadReason(t, zero, ""); reason != fmt.Sprintf(`no route matches event %s of topic "orders.created": routes[0] where is false; routes[1] where is false`, zero) {
		t.Errorf("dead letter of the event matching no filter: %q", reason)
	}
	reason := b.deadReason(t, noTotal, "")
	if !strings.Contains(reason, "routes[0] where failed: no such key: total") || !strings.Contains(reason, "routes[1] where failed: no such key: total") {
		t.Errorf("dead letter of the event the filters fail on: %q", reason)
	}
	if got := r.FilterErrors(); !slices.Equal(got, []int64{1, 1}) {
		t.Errorf("FilterErrors() = %v, want [1 1] (one failing event per route)", got)
	}
	if a := b.rec.forSink("big")[0].attempt; a != 2 {
		t.Errorf("big delivered %s at attempt %d, want 2: the retry from its queue kept its route", acmeBig, a)
	}
}

// TestWhereBinaryPayload shows payload is absent for a binary event:
// has(payload.x) is false, so the next route applies, and a filter reading
// payload.x fails on it without stopping the relay.
func TestWhereBinaryPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big, small := &testSink{name: "big", rec: b.rec}, &testSink{name: "small", rec: b.rec}
	cfg := b.config(t)
	cfg.Routes = []Route{
		{Topics: []string{"blobs"}, Where: whereFilter(t, `has(payload.total) && payload.total > 100`), Targets: []Target{{Sink: big}}},
		{Topics: []string{"blobs"}, Where: whereFilter(t, `key == "b1"`), Targets: []Target{{Sink: small}}},
		{Topics: []string{"images"}, Where: whereFilter(t, `payload.width > 10`), Targets: []Target{{Sink: small}}},
	}
	blob := b.insertRaw(t, "blobs", "b1", nil, []byte{0xff, 0x00, 0x01}, `{}`)
	image := b.insertRaw(t, "images", "i1", nil, []byte{0x89, 'P', 'N', 'G'}, `{}`)
	after := b.insertRaw(t, "blobs", "b1", jsonText(`{"total": 101}`), nil, `{}`)
	b.start(t, cfg)
	waitFor(t, time.Minute, "both blobs delivered and the image dead", func() bool {
		return len(b.rec.forSink("small")) == 1 && len(b.rec.forSink("big")) == 1 && b.deadReason(t, image, "") != ""
	})
	if got := idsAt(b, "small"); !slices.Equal(got, []string{blob}) {
		t.Errorf("small received %v, want the binary blob %s", got, blob)
	}
	if got := idsAt(b, "big"); !slices.Equal(got, []string{after}) {
		t.Errorf("big received %v, want the JSON blob %s", got, after)
	}
	if reason := b.deadReason(t, image, ""); !strings.Contains(reason, "routes[2] where failed: no such key: width") {
		t.Errorf("dead letter of the binary image: %q", reason)
	}
}

// TestWhereHostilePayload shows a filter walking a large payload (its
// nested loop would take 400 million steps) stops at the cost limit: the
// event is dead-lettered saying so, and the claim loop
// goes on to deliver the next event.
func TestWhereHostilePayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := &testSink{name: "mem", rec: b.rec}
	cfg := b.config(t)
	// Filtering the hostile payloads up to the cost limit takes seconds
	// under the race detector on a loaded machine: with the bundle's
	// 5s lease, the batch's record could miss its lease again and again.
	cfg.Lease = 30 * time.Second
	cfg.Routes = []Route{{Topics: []string{"t"}, Where: whereFilter(t, `payload.items.all(a, payload.items.all(b, a == b))`), Targets: []Target{{Sink: sink}}}}
	huge := b.insertRaw(t, "t", "k", jsonText(`{"items": [`+strings.Repeat(`1,`, 20_000)+`1]}`), nil, `{}`)
	deep := b.insertRaw(t, "t", "k", jsonText(`{"items": `+strings.Repeat("[", 11_000)+strings.Repeat("]", 11_000)+`}`), nil, `{}`)
	fine := b.insertRaw(t, "t", "k", jsonText(`{"items": [1, 1]}`), nil, `{}`)
	b.start(t, cfg)
	// Published events reach the recorder before their batch is recorded:
	// wait for the dead letters too.
	waitFor(t, 2*time.Minute, "the small event delivered and the others dead", func() bool {
		return len(b.rec.forSink("mem")) == 1 && b.deadReason(t, huge, "") != "" && b.deadReason(t, deep, "") != ""
	})
	if got := idsAt(b, "mem"); !slices.Equal(got, []string{fine}) {
		t.Errorf("mem received %v, want only %s", got, fine)
	}
	if reason := b.deadReason(t, huge, ""); !strings.Contains(reason, "routes[0] where failed: operation cancelled: actual cost limit exceeded") {
		t.Errorf("dead letter of the huge payload: %q", reason)
	}
	if reason := b.deadReason(t, deep, ""); !strings.Contains(reason, "routes[0] where failed: payload is not valid JSON") {
		t.Errorf("dead letter of the deeply nested payload: %q", reason)
	}
}

// TestFingerprintIncludesWhere shows relays whose routes differ only by a
// filter disagree, and that a configuration without filters keeps the
// fingerprint it had before filters existed (relays of the previous
// release, sharing the outbox, still agree with it).
func TestFingerprintIncludesWhere(t *testing.T) {
	t.Parallel()
	sink := &testSink{name: "mem"}
	plain := []Route{{Topics: []string{"orders.*"}, Targets: []Target{{Sink: sink}}}}
	filtered := []Route{{Topics: []string{"orders.*"}, Where: whereFilter(t, `key == "a"`), Targets: []Target{{Sink: sink}}}}
	other := []Route{{Topics: []string{"orders.*"}, Where: whereFilter(t, `key == "b"`), Targets: []Target{{Sink: sink}}}}
	fp := configFingerprint(plain)
	if fp == configFingerprint(filtered) || configFingerprint(filtered) == configFingerprint(other) {
		t.Errorf("fingerprints: plain %s, key a %s, key b %s; want all different", fp, configFingerprint(filtered), configFingerprint(other))
	}
	// The fingerprint of this route as commit 9bed394 (before where:) computed it.
	if fp != "06efc7f2f96ca045" {
		t.Errorf("fingerprint of a route without where = %s, changed from the previous release's", fp)
	}
}
