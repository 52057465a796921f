package nats

import (
	"testing"

	"github.com/heraldhq/herald/sinks/sinktest"
)

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		filter, subject string
		want            bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"*.b", "a.b", true},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{">", "a", true},
		{"a.*.c.>", "a.x.c.d.e", true},
		{"a.*.c.>", "a.x.d.d", false},
	} {
		if got := subjectMatches(tc.filter, tc.subject); got != tc.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", tc.filter, tc.subject, got, tc.want)
		}
	}
}

// TestHeaderSizeMatchesNATS checks the max_payload pre-check counts headers
// exactly as nats.go encodes them (Msg.Size uses its own encoder's size).
func TestHeaderSizeMatchesNATS(t *testing.T) {
	t.Parallel()
	e := sinktest.Event("orders.created", "k", []byte(`{"a":1}`))
	e.Headers = map[string]string{"x-pad": "  spaced value  ", "multi": "line\r\nbreak", "empty": ""}
	msg, err := encode(e, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := headerSize(msg.Header)+len(msg.Data), msg.Size()-len(msg.Subject); got != want {
		t.Fatalf("computed size %d, nats.go encodes %d", got, want)
	}
	size := headerSize(msg.Header) + len(msg.Data)
	if _, err := encode(e, int64(size), nil); err != nil {
		t.Fatalf("a message of exactly max_payload was refused: %v", err)
	}
	if _, err := encode(e, int64(size-1), nil); err == nil {
		t.Fatal("a message one byte over max_payload was accepted")
	}
}
