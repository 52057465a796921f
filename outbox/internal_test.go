package outbox

import (
	"testing"
	"time"
)

func TestNotifyIntervalDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want time.Duration
	}{
		{0, DefaultNotifyInterval},
		{time.Second, time.Second},
		{NotifyEveryCall, NotifyEveryCall},
	} {
		w, err := NewWriter(Config{NotifyInterval: tc.in})
		if err != nil {
			t.Fatal(err)
		}
		if w.notifyInterval != tc.want {
			t.Errorf("NotifyInterval %s: Writer uses %s, want %s", tc.in, w.notifyInterval, tc.want)
		}
	}
	if DefaultNotifyInterval != 20*time.Millisecond {
		t.Errorf("DefaultNotifyInterval = %s, want the documented 20ms", DefaultNotifyInterval)
	}
}

func TestIsJSON(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"application/json":                   true,
		"application/json; charset=utf-8":    true,
		"application/json ;charset=utf-8":    true,
		"application/cloudevents+json":       true,
		"application/problem+json; x=y":      true,
		"+json":                              false,
		"application/jsonl":                  false,
		"text/plain":                         false,
		"application/octet-stream":           false,
		"application/x-json-stream":          false,
		"application/vnd.kafka.avro.v2+avro": false,
		"application/vnd.api+json":           true,
	} {
		if got := isJSON(ct); got != want {
			t.Errorf("isJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}
