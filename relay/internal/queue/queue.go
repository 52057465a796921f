// Package queue holds the SQL that keeps the per-sink delivery queues'
// invariant, shared by the relay (which works the queues) and the dead-letter
// operations (which replay and purge their rows): in the deliveries table,
// every key that has deliveries waiting on a sink has exactly one head there,
// a delivery in state 'ready' (due at next_at) or a dead letter that stops
// its key. The other deliveries of that key and sink wait behind it, in seq
// order, with no time of their own.
package queue

import (
	"strings"

	"github.com/heraldhq/herald/migrations"
)

// Predicates on a delivery row, written exactly as in the indexes of
// migration 005 so that the planner matches them. The alias is "d".
const (
	// Member: the delivery belongs to its key's queue (it waits or holds
	// the key). Rows without a key are never members.
	Member = `(d.state <> 'dead' OR d.stops_key)`
	// Head: the delivery is the head of its key's queue.
	Head = `(d.state = 'ready' OR d.stops_key)`
)

// On returns the predicate p (Member or Head) on the alias a instead of d,
// for a statement that reads two rows of the table at once.
func On(p, a string) string { return strings.ReplaceAll(p, "d.", a+".") }

// Notification is the payload of the NOTIFY that tells relays the queues
// changed under them (dead letters replayed or purged): they look at their
// queues at once instead of at their next poll.
const Notification = "deliveries"

// PromoteSQL returns a statement that gives every (key, sink) pair in $1
// (keys) and $2 (sinks) that has waiting deliveries but no head a head: its
// lowest waiting delivery, due at once. fence, when not empty, is an extra
// condition on the promoted row (alias d), such as a test of its lane.
//
// Run it after any change that can remove a head (a delivery sent, purged,
// dead-lettered without stopping its key, or routed on) in the same
// transaction, under the lock that serialises writers of those keys' lanes.
func PromoteSQL(t migrations.Tables, fence string) string {
	dl := t.Deliveries()
	if fence == "" {
		fence = "true"
	}
	return `UPDATE ` + dl + ` d SET state = 'ready', next_at = now()
FROM (
    SELECT p.sink, (
        SELECT min(d.seq) FROM ` + dl + ` d
        WHERE d.key = p.key AND d.sink = p.sink AND ` + Member + ` AND d.state = 'waiting'
    ) AS seq
    FROM unnest($1::text[], $2::text[]) AS p(key, sink)
    WHERE NOT EXISTS (
        SELECT 1 FROM ` + dl + ` d WHERE d.key = p.key AND d.sink = p.sink AND ` + Head + `)
) n
WHERE d.sink = n.sink AND d.seq = n.seq AND ` + fence
}
