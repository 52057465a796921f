package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/heraldhq/herald/migrations/pgtest"
)

func TestBenchJSON(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	r := runRelay(t, []string{"DATABASE_URL=" + url}, "bench", "--events", "2000", "--relays", "2", "--json")
	if r.code != 0 {
		t.Fatalf("relay bench:\n%s", r)
	}
	var res struct {
		Mode         string  `json:"mode"`
		Events       int     `json:"events"`
		EventsPerS   float64 `json:"events_per_s"`
		Schema       string  `json:"schema"`
		Verification struct {
			Events         int  `json:"events"`
			Delivered      int  `json:"delivered"`
			Lost           int  `json:"lost"`
			Duplicates     *int `json:"duplicates"`
			KeyOrderIntact bool `json:"key_order_intact"`
		} `json:"verification"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("stdout is not the JSON result (%v):\n%s", err, r)
	}
	v := res.Verification
	if res.Mode != "drain" || res.Events != 2000 || res.EventsPerS <= 0 || v.Events != 2000 || v.Delivered != 2000 ||
		v.Lost != 0 || v.Duplicates == nil || !v.KeyOrderIntact {
		t.Fatalf("result %+v\n%s", res, r)
	}
	if strings.Contains(r.stdout+r.stderr, password) {
		t.Fatalf("the password was printed:\n%s", r)
	}
	var exists bool
	if err := pgtest.Pool(t).QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", res.Schema).Scan(&exists); err != nil || exists {
		t.Fatalf("bench schema %s left behind (%v)", res.Schema, err)
	}
}

func TestBenchText(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	r := runRelay(t, nil, "bench", "--events", "500", "--keys", "0", "--database-url", url)
	if r.code != 0 || !strings.Contains(r.stdout, "verified: 500 events, 0 lost, 0 duplicates, key order intact") ||
		!strings.Contains(r.stdout, "one key per event") {
		t.Fatalf("relay bench:\n%s", r)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--mode", "soak", "--database-url", "postgres://u@127.0.0.1:1/db"}, `--mode: "soak" must be drain or live`},
		{[]string{"bench", "--sink", "email", "--database-url", "postgres://u@127.0.0.1:1/db"}, `--sink: "email"`},
		{[]string{"bench", "--schema", "x", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--schema: relay bench creates"},
		{[]string{"bench"}, "--database-url: no database given"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			r := runRelay(t, nil, c.args...)
			if r.code != 2 || !strings.Contains(r.stderr, c.want) {
				t.Fatalf("want exit 2 and %q, got\n%s", c.want, r)
			}
		})
	}
}
