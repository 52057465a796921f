// Package relaybench measures Herald's relay against a real PostgreSQL: the
// logic behind `relay bench`.
//
// A run creates a schema of its own (a unique name, migrated with
// migrations.Migrator, dropped at the end unless Config.Keep), starts
// in-process relays (relay.Relay, each with its own connection pool) that
// publish to a sink wrapped in a Recorder, and then either
//
//   - drains a backlog (ModeDrain): Events rows are committed in one
//     transaction (server-side generate_series, in chunks, not timed) once
//     the relays have shared out the lanes, and the time from that commit
//     until every event is acknowledged by the sink and recorded in the
//     database is the drain time; or
//   - serves live traffic (ModeLive): producers commit one event per
//     transaction through the outbox library at a fixed rate while the
//     relays run, and the latency of each event is the sink's
//     acknowledgement time minus the time tx.Commit returned.
//
// Every run ends with Verify: each committed event must have been
// acknowledged at least once, and, per key, the first deliveries must follow
// the events' seq order. Event ids encode a per-run nonce and the event's
// index, so the Recorder keeps a few dozen bytes per delivery and no map.
package relaybench
