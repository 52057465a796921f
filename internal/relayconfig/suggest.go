package relayconfig

import (
	"slices"
	"strings"
)

// nearestKey returns the key of known closest to key, the one a typo most
// likely meant ("max_attemps": "max_attempts"), or "" when none is close
// enough to be a typo of it. Keys are compared lowercased, with "-" read
// as "_", by edit distance counting a swap of two neighbours as one edit;
// a suggestion may be at most a third of key's length away (at least one
// edit, at most three), and ties go to the first in sorted order.
func nearestKey(key string, known []string) string {
	want := normalizeKey(key)
	limit := min(max(len([]rune(want))/3, 1), 3)
	best, bestDist := "", limit+1
	for _, k := range slices.Sorted(slices.Values(known)) {
		if d := editDistance(want, normalizeKey(k)); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

func normalizeKey(k string) string {
	return strings.ReplaceAll(strings.ToLower(k), "-", "_")
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent runes, each
// one edit.
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	// rows[2] is the row being filled, rows[1] the one before, rows[0] the
	// one before that (for swaps).
	rows := [3][]int{make([]int, len(y)+1), make([]int, len(y)+1), make([]int, len(y)+1)}
	for j := range rows[1] {
		rows[1][j] = j
	}
	for i := 1; i <= len(x); i++ {
		cur, prev, prev2 := rows[2], rows[1], rows[0]
		cur[0] = i
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		rows[0], rows[1], rows[2] = prev, cur, prev2
	}
	return rows[1][len(y)]
}
