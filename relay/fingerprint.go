package relay

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
)

// configFingerprint identifies what a relay routes where: each route's
// topic patterns, its where filter and its sinks with their destination
// templates, routes in order (the first match applies), patterns and sinks
// within a route in any order. Relays sharing an outbox compare fingerprints, so that only those
// with the newest configuration claim. A sink's own settings (URLs,
// credentials) are not part of it: relays must agree on which sinks an
// event goes to, not on how each reaches its destination.
func configFingerprint(routes []Route) string {
	h := sha256.New()
	for _, r := range routes {
		patterns := slices.Sorted(slices.Values(r.Topics))
		targets := make([]string, 0, len(r.Targets))
		for _, t := range r.Targets {
			dest := ""
			if t.Destination != nil && t.Destination.Tree != nil {
				dest = t.Destination.Root.String()
			}
			targets = append(targets, t.Sink.Name()+"\x00"+dest)
		}
		slices.Sort(targets)
		h.Write([]byte("route\x00" + strings.Join(patterns, "\x00") + "\x01" + strings.Join(targets, "\x01") + "\x02"))
		if r.Where != nil {
			// Written only when set: a configuration without filters keeps
			// the fingerprint it had before filters existed.
			h.Write([]byte("where\x00" + r.Where.String() + "\x02"))
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
