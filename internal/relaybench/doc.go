// Package relaybench measures Herald's relay against a real PostgreSQL, or
// MySQL or MariaDB: the logic behind `relay bench`.
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
// Three modes measure the failure path. ModeOutage and ModeIsolation route
// every event to two sinks, "up" (the run's sink type) and "down" (an
// in-process sink that refuses every event with sinks.Unavailable while its
// outage lasts):
//
//   - ModeOutage commits a backlog while "down" is down, keeps it down for
//     Config.Outage, then brings it back and waits until the outbox and
//     deliveries tables are empty. It reports the tables' row writes from
//     pg_stat_user_tables (the events' own INSERT excluded), read once every
//     session that wrote them has ended, and the catch-up time.
//   - ModeIsolation runs ModeLive's producers while "down" is down from
//     Config.OutageAfter for Config.Outage, and reports the healthy sink's
//     latency per minute, before, during and after the outage, next to the
//     down sink's queue depth.
//   - ModeHotKey queues one key's events behind a head its sink keeps
//     failing with a retryable error, then times the drain of a backlog of
//     the other keys and reports the claims' durations; afterwards the key
//     heals and its events are delivered.
//
// Three modes measure isolation, with webhook sinks posting to
// receivers in the bench's process (receiver.go), which note when each
// event arrived:
//
//   - ModeSlow runs ModeLive's producers to a fast and a slow webhook on one
//     route and reports the fast one's commit-to-arrival latency and the
//     slow one's throughput against what its concurrency allows;
//   - ModeRecovery times the same number of events to a webhook flowing
//     (committed while it is up) and queued (committed while it is down,
//     drained once it is back);
//   - ModeSkew sets relay.Config.Clock hours off, fails each event's first
//     attempts and compares the retries' spacing with the backoff.
//
// ModeBinary times the relay as a user meets it: `relay run` in
// a process of its own, from its start until its own
// herald_events_published_total, scraped from its admin server, counts the
// committed backlog. ModeIdle counts what relays at rest send the
// database (a pgx tracer on their pools) and the CPU it costs.
//
// On MySQL or MariaDB (a mysql:// Config.DatabaseURL; mysql.go), ModeDrain,
// ModeLive and ModeBinary run in a database of the run's own. The backlog and the
// producers are plain INSERTs, the drain wakes the relays in process after
// its commit (relay.Relay.Wake), and an insert probe times an application's
// INSERT into the outbox throughout the drain, counting any that would have
// waited for a lock (Result.Insert).
//
// Every run ends with Verify: each committed event must have been
// acknowledged at least once, by every sink, and, per key and sink, the first
// deliveries must follow the events' seq order. Event ids encode a per-run nonce and the event's
// index, so the Recorder keeps a few dozen bytes per delivery and no map.
package relaybench
