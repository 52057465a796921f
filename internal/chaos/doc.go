// Package chaos holds Herald's chaos suite: several real relay processes
// deliver a continuous stream of events to NATS JetStream and a webhook
// while the test kills and stops them, cuts their database connections,
// restarts the database and NATS and makes the webhook fail, then checks
// that every committed event reached every sink routed to it, in per-key
// order, and that only the events the test made fail for good are dead
// letters.
//
// The suite runs against a throwaway database server, a PostgreSQL cluster
// (initdb into a temporary directory, on a free port) or, for
// TestChaosMariaDB, a MariaDB server (mariadb-install-db and mariadbd, the
// same way), and an in-process NATS server, so its restarts disturb no
// other test. The relays are the relay binary (`relay run`) on either
// database. The default run, part of the README's test command and so of
// CI, injects a fixed number of faults from a fixed seed per test, printed
// at the start. Longer runs explore other schedules:
//
//	CHAOS_SEED=random CHAOS_DURATION=10m go test -v ./internal/chaos/
//
// CHAOS_SEED=N (or -chaos.seed N) replays the schedule of seed N, which is
// printed at the start and on failure; CHAOS_DURATION (or -chaos.duration)
// injects faults for that long instead of the fixed number.
package chaos
