package relaycmd

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/rabbitmqtest"
	"github.com/heraldhq/herald/internal/redistest"
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

// TestBenchMySQL: relay bench takes a mysql:// database (drain and live;
// the failure modes are PostgreSQL's only) and times an application's
// INSERT during the drain.
func TestBenchMySQL(t *testing.T) {
	t.Parallel()
	url := mysqltest.URL(t)
	r := runRelay(t, nil, "bench", "--events", "300", "--database-url", url)
	if r.code != 0 || !strings.Contains(r.stdout, "verified: 300 events, 0 lost, 0 duplicates, key order intact") ||
		!strings.Contains(r.stdout, "an application's INSERT during the drain: ") {
		t.Fatalf("relay bench:\n%s", r)
	}
	r = runRelay(t, nil, "bench", "--mode", "hotkey", "--database-url", url)
	if r.code != 2 || !strings.Contains(r.stderr, "--mode: hotkey runs on PostgreSQL only") {
		t.Fatalf("relay bench --mode hotkey on MySQL:\n%s", r)
	}
}

// TestBenchHelpWrapsWholeParagraphs: in `relay bench --help`, a line that
// is not the last of its paragraph is filled (at least 60 characters), so
// no sentence breaks off mid-line.
func TestBenchHelpWrapsWholeParagraphs(t *testing.T) {
	t.Parallel()
	r := runRelay(t, nil, "bench", "--help")
	long, _, ok := strings.Cut(r.stdout, "\nUsage:")
	if r.code != 0 || !ok {
		t.Fatalf("relay bench --help:\n%s", r)
	}
	for _, para := range strings.Split(strings.TrimSpace(long), "\n\n") {
		lines := strings.Split(para, "\n")
		for _, line := range lines[:len(lines)-1] {
			if len(line) < 60 {
				t.Errorf("a short line inside a paragraph: %q\nparagraph:\n%s", line, para)
			}
		}
	}
}

// TestBenchBinary: relay bench --mode binary starts this very binary as
// relay run (the default --relay-binary) and times it by its own counter.
func TestBenchBinary(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	r := runRelay(t, nil, "bench", "--mode", "binary", "--events", "2000", "--keys", "20", "--database-url", url)
	if r.code != 0 || !strings.Contains(r.stdout, "counted by herald_events_published_total: 2000 of 2000 events; rows left 0") {
		t.Fatalf("relay bench:\n%s", r)
	}
	if strings.Contains(r.stdout+r.stderr, password) {
		t.Fatalf("the password was printed:\n%s", r)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--mode", "soak", "--database-url", "postgres://u@127.0.0.1:1/db"}, `--mode: "soak" must be drain, live, outage, isolation, hotkey, slow, recovery, skew, binary or idle`},
		{[]string{"bench", "--mode", "skew", "--fail-attempts", "10", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--fail-attempts: must be between 1 and 9"},
		{[]string{"bench", "--mode", "skew", "--clock-offset", "25h", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--clock-offset: must be within ±24h"},
		{[]string{"bench", "--mode", "slow", "--answer-after", "-1s", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--answer-after: must not be negative"},
		{[]string{"bench", "--mode", "isolation", "--keys", "3", "--producers", "4", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--keys: at least --producers (4) when producers commit"},
		{[]string{"bench", "--mode", "recovery", "--webhook-concurrency", "-1", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--webhook-concurrency: must be between 1 and 1000"},
		{[]string{"bench", "--mode", "slow", "--sink", "nats", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--sink: --mode slow chooses its own sinks"},
		{[]string{"bench", "--mode", "binary", "--relays", "2", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--relays: --mode binary starts one relay process"},
		{[]string{"bench", "--mode", "isolation", "--duration", "30s", "--database-url", "postgres://u@127.0.0.1:1/db"},
			"--duration: 30s must be longer than --outage-after (1m0s) plus --outage (5m0s)"},
		{[]string{"bench", "--mode", "outage", "--outage", "-1s", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--outage: must be positive"},
		{[]string{"bench", "--mode", "hotkey", "--hot-events", "-1", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--hot-events"},
		{[]string{"bench", "--pause-max", "-1s", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--pause-max"},
		{[]string{"bench", "--backoff-max", "-1s", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--backoff-max"},
		{[]string{"bench", "--sink", "email", "--database-url", "postgres://u@127.0.0.1:1/db"}, `--sink: "email"`},
		{[]string{"bench", "--sink", "kafka", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--kafka-brokers: required with --sink kafka"},
		{[]string{"bench", "--sink", "redis", "--redis-url", "http://u:pa55@127.0.0.1:6379", "--database-url", "postgres://u@127.0.0.1:1/db"}, `--redis-url: url: "http://[redacted]@127.0.0.1:6379": the scheme must be redis, rediss or unix`},
		{[]string{"bench", "--sink", "rabbitmq", "--rabbitmq-url", "http://guest:s3cret@127.0.0.1:5672/", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--rabbitmq-url: not an AMQP URI"},
		{[]string{"bench", "--sink", "pubsub", "--pubsub-endpoint", "localhost", "--database-url", "postgres://u@127.0.0.1:1/db"}, `--pubsub-endpoint: "localhost" is not host:port`},
		{[]string{"bench", "--sink", "pubsub", "--pubsub-project", "a/b", "--database-url", "postgres://u@127.0.0.1:1/db"}, `--pubsub-project: "a/b" is not a project id`},
		{[]string{"bench", "--nats-embedded", "--database-url", "postgres://u@127.0.0.1:1/db"}, "unknown flag: --nats-embedded"},
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

// TestBenchSinksAtPeers runs the binary's bench against peers it is given,
// as docs/benchmarks.md does: the real NATS server and RabbitMQ broker, a
// Kafka broker (kfake) and a webhook receiver started by the test, not by
// the binary. The receiver counts what reached it.
func TestBenchSinksAtPeers(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	kafkaBroker, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafkaBroker.Close)
	var received atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("webhook-id") == "" {
			http.Error(w, "no webhook-id", http.StatusBadRequest)
			return
		}
		received.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	pubsubServer := pstest.NewServer()
	t.Cleanup(func() { _ = pubsubServer.Close() })

	cases := map[string][]string{
		"nats":    {"--sink", "nats", "--nats-url", natstest.URL(t)},
		"kafka":   {"--sink", "kafka", "--kafka-brokers", strings.Join(kafkaBroker.ListenAddrs(), ","), "--kafka-partitions", "4"},
		"webhook": {"--sink", "webhook", "--webhook-url", receiver.URL + "/hook"},
		// Without --webhook-url: an endpoint in the bench's process.
		"webhook-in-process": {"--sink", "webhook"},
		"rabbitmq":           {"--sink", "rabbitmq", "--rabbitmq-url", rabbitmqtest.URL(t)},
		"redis":              {"--sink", "redis", "--redis-url", redistest.URL(t)},
		"pubsub":             {"--sink", "pubsub", "--pubsub-endpoint", pubsubServer.Addr},
	}
	for name, sinkArgs := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"bench", "--events", "300", "--keys", "10", "--database-url", url, "--json"}, sinkArgs...)
			r := runRelay(t, nil, args...)
			if r.code != 0 {
				t.Fatalf("relay %s:\n%s", strings.Join(args, " "), r)
			}
			var res struct {
				Sink         string `json:"sink"`
				Verification struct {
					Delivered int `json:"delivered"`
					Lost      int `json:"lost"`
				} `json:"verification"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("stdout is not the JSON result (%v):\n%s", err, r)
			}
			if res.Sink != sinkArgs[1] || res.Verification.Delivered != 300 || res.Verification.Lost != 0 {
				t.Fatalf("result %+v\n%s", res, r)
			}
			if name == "webhook" && received.Load() < 300 {
				t.Fatalf("the receiver got %d of 300 events", received.Load())
			}
			if name == "pubsub" && len(pubsubServer.Messages()) < 300 {
				t.Fatalf("the Pub/Sub server stored %d of 300 events", len(pubsubServer.Messages()))
			}
		})
	}
}

func TestBenchOutageJSON(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	// 100 events per key: every queue is claimed whole.
	r := runRelay(t, nil, "bench", "--mode", "outage", "--events", "1500", "--keys", "15", "--outage", "1s",
		"--pause-max", "100ms", "--database-url", url, "--json")
	if r.code != 0 {
		t.Fatalf("relay bench:\n%s", r)
	}
	var res struct {
		Mode   string `json:"mode"`
		Events int    `json:"events"`
		Outage *struct {
			OutageS    float64  `json:"outage_s"`
			PauseMaxS  float64  `json:"pause_max_s"`
			QueueDepth *int64   `json:"queue_depth"`
			CatchUpS   *float64 `json:"catch_up_s"`
			Writes     struct {
				Outbox     struct{ Inserted, Updated, Deleted, Writes int64 } `json:"outbox"`
				Deliveries struct{ Inserted, Updated, Deleted, Writes int64 } `json:"deliveries"`
				Total      int64                                              `json:"total"`
				PerEvent   float64                                            `json:"per_event"`
			} `json:"writes"`
		} `json:"outage"`
		Sinks []struct {
			Name         string `json:"name"`
			Verification struct {
				Delivered int `json:"delivered"`
			} `json:"verification"`
		} `json:"sinks"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("stdout is not the JSON result (%v):\n%s", err, r)
	}
	o := res.Outage
	if res.Mode != "outage" || res.Events != 1500 || o == nil || o.OutageS < 1 || o.PauseMaxS != 0.1 || o.QueueDepth == nil || o.CatchUpS == nil {
		t.Fatalf("result %+v\n%s", res, r)
	}
	if w := o.Writes; w.Outbox.Deleted != 1500 || w.Outbox.Writes != 1500 || w.Total <= 0 || w.PerEvent > 3 {
		t.Fatalf("writes %+v\n%s", w, r)
	}
	if len(res.Sinks) != 2 || res.Sinks[0].Name != "up" || res.Sinks[1].Name != "down" ||
		res.Sinks[0].Verification.Delivered != 1500 || res.Sinks[1].Verification.Delivered != 1500 {
		t.Fatalf("sinks %+v", res.Sinks)
	}
}

func TestBenchIsolationJSON(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	r := runRelay(t, nil, "bench", "--mode", "isolation", "--rate", "300", "--keys", "20", "--outage-after", "1s", "--outage", "1s",
		"--duration", "3s", "--pause-max", "100ms", "--report-every", "500ms", "--database-url", url, "--json")
	if r.code != 0 {
		t.Fatalf("relay bench:\n%s", r)
	}
	var res struct {
		Mode      string `json:"mode"`
		Isolation *struct {
			OutageAfterS float64         `json:"outage_after_s"`
			OutageS      float64         `json:"outage_s"`
			Before       json.RawMessage `json:"before_ms"`
		} `json:"isolation"`
		Intervals []struct {
			Phase     string `json:"phase"`
			DownQueue *int64 `json:"down_queue"`
		} `json:"intervals"`
		Verification struct {
			Lost           int  `json:"lost"`
			KeyOrderIntact bool `json:"key_order_intact"`
		} `json:"verification"`
		Sinks []json.RawMessage `json:"sinks"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("stdout is not the JSON result (%v):\n%s", err, r)
	}
	iso := res.Isolation
	if res.Mode != "isolation" || iso == nil || iso.OutageAfterS != 1 || iso.OutageS != 1 || len(iso.Before) == 0 ||
		len(res.Sinks) != 2 || res.Verification.Lost != 0 || !res.Verification.KeyOrderIntact {
		t.Fatalf("result %+v\n%s", res, r)
	}
	if len(res.Intervals) == 0 || res.Intervals[0].Phase != "before" || res.Intervals[0].DownQueue == nil {
		t.Fatalf("intervals %+v\n%s", res.Intervals, r)
	}
}

func TestBenchHotKeyText(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	r := runRelay(t, nil, "bench", "--mode", "hotkey", "--events", "1000", "--hot-events", "100", "--backoff-max", "100ms", "--database-url", url)
	if r.code != 0 || !strings.Contains(r.stdout, "hot key k1000: 100 events queued behind a head that keeps failing") ||
		!strings.Contains(r.stdout, "1000 events in ") || !strings.Contains(r.stdout, "verified: 1100 events, 0 lost") {
		t.Fatalf("relay bench:\n%s", r)
	}
	r = runRelay(t, nil, "bench", "--mode", "hotkey", "--events", "500", "--hot-events", "0", "--database-url", url)
	if r.code != 0 || !strings.Contains(r.stdout, "no hot key") || !strings.Contains(r.stdout, "verified: 500 events, 0 lost") {
		t.Fatalf("relay bench --hot-events 0:\n%s", r)
	}
}
