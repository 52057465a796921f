package routefilter_test

import (
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/routefilter"
)

func TestCompileErrorsNamePosition(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ expr, want string }{
		{`payload.total >`, "line 1, column 16: Syntax error"},
		{"topic == \"a\" &&\n  nope == 1", "line 2, column 3: undeclared reference to 'nope'"},
		{`topic + "x"`, "of type string, not bool"},
		{`payload.flag`, "of type dyn, not bool"},
		{`key > 1`, "line 1, column 5: found no matching overload for '_>_'"},
		{`  `, "empty expression"},
		{strings.Repeat("a", 5000), "more than 4096"},
	} {
		_, err := routefilter.Compile(tc.expr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Compile(%.40q) = %v, want an error containing %q", tc.expr, err, tc.want)
		}
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	order := &routefilter.Event{Topic: "orders", Key: "k1", Headers: map[string]string{"tenant": "acme"},
		Payload: []byte(`{"total": 150, "lines": [{"sku": "a"}], "note": null}`), JSON: true}
	binary := &routefilter.Event{Topic: "blobs", Payload: []byte{0xff, 0x00}, JSON: false}
	noHeaders := &routefilter.Event{Topic: "orders", Payload: []byte(`{"total": 5}`), JSON: true}
	for _, tc := range []struct {
		expr    string
		ev      *routefilter.Event
		want    bool
		wantErr string
	}{
		{`payload.total > 100 && headers["tenant"] == "acme"`, order, true, ""},
		{`payload.total == 150`, order, true, ""},
		{`payload.total > 200`, order, false, ""},
		{`payload.lines[0].sku == "a" && key == "k1" && topic.startsWith("ord")`, order, true, ""},
		{`has(payload.total) && !has(payload.missing)`, order, true, ""},
		{`payload.note == null`, order, true, ""},
		{`payload.missing > 1`, order, false, "no such key: missing"},
		{`has(payload.total)`, binary, false, ""},
		{`payload.total > 1`, binary, false, "no such key: total"},
		{`topic == "blobs"`, binary, true, ""},
		{`"tenant" in headers`, noHeaders, false, ""},
		{`headers["tenant"] == "acme"`, noHeaders, false, "no such key: tenant"},
	} {
		f, err := routefilter.Compile(tc.expr)
		if err != nil {
			t.Fatalf("Compile(%q): %v", tc.expr, err)
		}
		got, err := f.Match(tc.ev)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: error %v, want one containing %q", tc.expr, err, tc.wantErr)
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: unexpected error %v", tc.expr, err)
		case got != tc.want:
			t.Errorf("%q = %v, want %v", tc.expr, got, tc.want)
		}
	}
}

// TestPayloadParsedOnce shows the payload is parsed only when an
// expression reads it, and once for all the filters an event meets: an
// invalid payload fails only the filters that read it.
func TestPayloadParsedOnce(t *testing.T) {
	t.Parallel()
	ev := &routefilter.Event{Topic: "t", Payload: []byte(`{not json`), JSON: true}
	topicOnly, err := routefilter.Compile(`topic == "t"`)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := topicOnly.Match(ev); !ok || err != nil {
		t.Fatalf("a filter not reading the payload: %v, %v; want true, nil", ok, err)
	}
	readsPayload, err := routefilter.Compile(`payload.x == 1`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readsPayload.Match(ev); err == nil || !strings.Contains(err.Error(), "payload is not valid JSON") {
		t.Fatalf("a filter reading an invalid payload: error %v, want one saying so", err)
	}
	// The second evaluation sees the parse result of the first: changing
	// the bytes afterwards does not change what payload is.
	ev.Payload = []byte(`{"x": 1}`)
	if _, err := readsPayload.Match(ev); err == nil {
		t.Fatal("the payload was parsed again for a second filter")
	}
}

// TestCostLimit shows filters walking a huge payload stop at MaxCost with
// an error instead of running to the end (a nested walk would take 4×10^8
// steps), and a payload nested deeper than encoding/json reads is an error.
func TestCostLimit(t *testing.T) {
	t.Parallel()
	items := strings.Repeat(`"hay",`, 20_000) + `"needle"`
	ev := &routefilter.Event{Topic: "t", Payload: []byte(`{"items": [` + items + `]}`), JSON: true}
	f, err := routefilter.Compile(`payload.items.all(a, payload.items.all(b, a == b)) || payload.items.exists(i, i == "needle")`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Match(ev); err == nil || !strings.Contains(err.Error(), "cost limit exceeded") {
		t.Fatalf("Match = %v, want the cost limit error", err)
	}
	deep := &routefilter.Event{Topic: "t", Payload: []byte(strings.Repeat("[", 20000) + strings.Repeat("]", 20000)), JSON: true}
	g, err := routefilter.Compile(`size(payload) > 0`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Match(deep); err == nil || !strings.Contains(err.Error(), "payload is not valid JSON") {
		t.Fatalf("Match on 20000 nested arrays = %v, want a parse error (encoding/json's depth limit)", err)
	}
}
