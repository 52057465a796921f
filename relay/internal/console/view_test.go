package console

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestLaneRanges(t *testing.T) {
	t.Parallel()
	all := make([]int16, 64)
	for i := range all {
		all[i] = int16(i)
	}
	for want, lanes := range map[string][]int16{
		"":                 nil,
		"7":                {7},
		"0–63":             all,
		"0–31":             all[:32],
		"0–2, 5, 7–9, 63":  {0, 1, 2, 5, 7, 8, 9, 63},
		"3, 5":             {3, 5},
		"10–11, 20–21, 30": {10, 11, 20, 21, 30},
	} {
		if got := laneRanges(lanes); got != want {
			t.Errorf("laneRanges(%v) = %q, want %q", lanes, got, want)
		}
	}
}

// TestRecentOpsAreBounded: the console remembers what it did to at most
// recentLimit events, forgetting the oldest first; doing it again makes
// an event the newest.
func TestRecentOpsAreBounded(t *testing.T) {
	t.Parallel()
	r := newRecentOps()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	first := uuid.NewString()
	r.add("replay", at, []string{first, "not-a-uuid"})
	var ids []string
	for range recentLimit - 1 {
		ids = append(ids, uuid.NewString())
	}
	r.add("replay", at, ids)
	r.add("purge", at.Add(time.Minute), []string{first}) // first becomes the newest
	r.add("replay", at, []string{uuid.NewString()})      // one past the bound: ids[0] goes
	if len(r.byID) != recentLimit || len(r.order) != recentLimit {
		t.Fatalf("%d ids kept (%d in order), want %d", len(r.byID), len(r.order), recentLimit)
	}
	if op, ok := r.get(first); !ok || op.Op != "purge" || !op.At.Equal(at.Add(time.Minute)) {
		t.Fatalf("the event done again: %+v, %v", op, ok)
	}
	if _, ok := r.get(ids[0]); ok {
		t.Fatal("the oldest event is still remembered past the bound")
	}
	if _, ok := r.get("not-a-uuid"); ok {
		t.Fatal("a malformed id was remembered")
	}
	if op, ok := r.get(ids[1]); !ok || op.Op != "replay" {
		t.Fatalf("the second oldest: %+v, %v", op, ok)
	}
}
