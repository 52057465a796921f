package walcapture

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/relay/internal/store"
)

// TestScanReadsWhatTheServerWrites: for hostile events emitted through
// outbox_emit and outbox_emit_bytes (escapes, braces and quotes inside
// strings, non-ASCII and control characters, scalar and nested payloads,
// every byte value), the scanner reads each message the server wrote, and
// reads it as encoding/json does.
func TestScanReadsWhatTheServerWrites(t *testing.T) {
	t.Parallel()
	pool := pgtest.WALPool(t)
	pgtest.RequireLogicalWAL(t, pool)
	tables := pgtest.Schema(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", tables.SlotName()); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	jsonEvents := []struct{ topic, key, payload, headers string }{
		{"orders.paid", "order-1", `{"total": 12.5, "items": [1, 2]}`, `{}`},
		{`to"p\ic`, `k}{"ey\`, `{"s": "}\"{][", "n": {"deep": [[[{}]]]}}`, `{"h\"1": "v}{", "trace": "a,b"}`},
		{"ordér.ünïcode", "κλειδί 🔑", `"just a string, with a comma"`, `{"é": "ü"}`},
		{"t", "tab\tnew\nline\u0001", `12345`, `{"x": "\n\t\u0001"}`},
		{"t", "", `[1, "two", null, true, {"three": 3}]`, `{}`},
		{"t", "k", `true`, `{}`},
		{"t", "k", `null`, `{}`},
	}
	for _, e := range jsonEvents {
		var key *string
		if e.key != "" {
			key = &e.key
		}
		if _, err := tx.Exec(ctx, "SELECT "+tables.Emit()+"($1, $2, $3::jsonb, $4::jsonb, max_attempts => 7)", e.topic, key, e.payload, e.headers); err != nil {
			t.Fatalf("emitting %+v: %v", e, err)
		}
	}
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	if _, err := tx.Exec(ctx, "SELECT "+tables.EmitBytes()+"('bin', 'k', $1, 'application/x-protobuf', '{\"h\": \"v\"}')", every); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT "+tables.EmitBytes()+"('bin', NULL, ''::bytea)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	rows, err := pool.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, tables.SlotName(), tables.PublicationName())
	if err != nil {
		t.Fatal(err)
	}
	var contents [][]byte
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			t.Fatal(err)
		}
		msg, err := pglogrepl.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := msg.(*pglogrepl.LogicalDecodingMessage); ok && m.Prefix == tables.MessagePrefix() {
			contents = append(contents, m.Content)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := len(jsonEvents) + 2; len(contents) != want {
		t.Fatalf("read %d messages, want %d", len(contents), want)
	}
	var d decoder
	for i, c := range contents {
		got, ok := d.scan(c)
		if !ok {
			t.Errorf("message %d: the scanner refused what the server wrote: %s", i, c)
			continue
		}
		want, err := decodeJSON(c)
		if err != nil {
			t.Fatalf("message %d: encoding/json: %v", i, err)
		}
		sameEvent(t, got, want, string(c))
		if i < len(jsonEvents) {
			e := jsonEvents[i]
			if got.Topic != e.topic || got.Key != e.key || got.MaxAttempts != 7 {
				t.Errorf("message %d: topic %q key %q max_attempts %d, want %q %q 7", i, got.Topic, got.Key, got.MaxAttempts, e.topic, e.key)
			}
			if e.payload == "null" {
				e.payload = "" // a JSON null payload is no payload
			}
			if !sameJSON(t, got.Payload, e.payload) || !sameJSON(t, got.Headers, e.headers) {
				t.Errorf("message %d: payload %s headers %s, want %s and %s", i, got.Payload, got.Headers, e.payload, e.headers)
			}
		}
	}
	if bin := contents[len(jsonEvents)]; true {
		got, _ := d.scan(bin)
		if !reflect.DeepEqual(got.PayloadBin, every) || got.ContentType != "application/x-protobuf" {
			t.Errorf("binary payload read as %v (%q), want every byte value", got.PayloadBin, got.ContentType)
		}
	}
}

// sameJSON reports whether got is the JSON text want (both empty, or the
// same value).
func sameJSON(t *testing.T, got []byte, want string) bool {
	t.Helper()
	if len(got) == 0 || want == "" {
		return len(got) == 0 && want == ""
	}
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: %v", want, err)
	}
	return reflect.DeepEqual(g, w)
}

// sameEvent fails the test unless got and want are the same event.
func sameEvent(t *testing.T, got, want store.Event, content string) {
	t.Helper()
	if !got.CreatedAt.Equal(want.CreatedAt) {
		t.Errorf("created_at %v, encoding/json %v, of %s", got.CreatedAt, want.CreatedAt, content)
	}
	got.CreatedAt = want.CreatedAt
	if len(got.PayloadBin) == 0 && len(want.PayloadBin) == 0 {
		got.PayloadBin, want.PayloadBin = nil, nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("scanned\n%+v\nencoding/json\n%+v\nof %s", got, want, content)
	}
}

// FuzzScan: whatever the scanner accepts, encoding/json reads the same
// way (the scanner may refuse more: those messages go to encoding/json).
func FuzzScan(f *testing.F) {
	for _, seed := range []string{
		`{"seq" : 12, "id" : "9609c594-e135-420d-a8c2-0e6d4cf4bac7", "topic" : "orders.paid", "key" : "k\"1", "lane" : 5, "payload" : {"a": [1, "x\\\"}"]}, "payload_bin" : null, "content_type" : null, "headers" : {}, "created_at" : "2026-12-05T21:53:24.134054+00:00", "max_attempts" : null}`,
		`{"seq" : 12, "id" : "fa2ffc5b-acb8-4d39-8717-d9697629d5d6", "topic" : "orders.paid", "key" : null, "lane" : 5, "payload" : null, "payload_bin" : "AQI=", "content_type" : "application/x", "headers" : {"h": "v"}, "created_at" : "2026-12-05T21:53:24.135146+00:00", "max_attempts" : 3}`,
		`{"seq" : 1, "id" : "x", "topic" : "t", "key" : "k", "lane" : 0, "payload" : 5, "payload_bin" : null, "content_type" : null, "headers" : {}, "created_at" : "2026-12-05T21:53:24Z", "max_attempts" : null}`,
		`{"seq" : 1, "id" : "x", "topic" : "t", "key" : "k", "lane" : 0, "payload" : {"a": }, "payload_bin" : null, "content_type" : null, "headers" : {}, "created_at" : "2026-12-05T21:53:24Z", "max_attempts" : null}`,
		`{"seq":1,"id":"x"}`,
		`not json`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		var d decoder
		got, ok := d.scan(content)
		if !ok {
			return
		}
		want, err := decodeJSON(content)
		if err != nil {
			t.Fatalf("the scanner read %+v from what encoding/json refuses (%v): %q", got, err, content)
		}
		sameEvent(t, got, want, string(content))
	})
}

// BenchmarkDecode compares the scanner with encoding/json on a message as
// outbox_emit writes it, with a 200-byte payload.
func BenchmarkDecode(b *testing.B) {
	content := []byte(`{"seq" : 123456, "id" : "9609c594-e135-420d-a8c2-0e6d4cf4bac7", "topic" : "orders.paid", "key" : "order-4242", "lane" : 5, "payload" : {"order_id": "order-4242", "customer": "c-981", "total": 129.95, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}], "note": "leave at the door, ring twice"}, "payload_bin" : null, "content_type" : null, "headers" : {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "created_at" : "2026-12-05T21:53:24.134054+00:00", "max_attempts" : null}`)
	b.Run("scan", func(b *testing.B) {
		var d decoder
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := d.scan(content); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeJSON(content); err != nil {
				b.Fatal(err)
			}
		}
	})
}
