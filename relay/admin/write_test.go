package admin

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// An answer that cannot be encoded (a time after year 9999, which JSON
// cannot carry) is a 500 saying so, never a 200 with an empty body.
func TestWriteJSONNeverSendsAnEmptySuccess(t *testing.T) {
	rec := httptest.NewRecorder()
	writeJSON(rec, 200, map[string]time.Time{"at": time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)})
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), "could not be encoded") {
		t.Fatalf("answer %d %q, want 500 naming the failure", rec.Code, rec.Body.String())
	}
}
