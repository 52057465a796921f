// Package chaos holds Herald's chaos suite: several real relay processes
// deliver a continuous stream of events to NATS JetStream and a webhook
// while the test kills and stops them, cuts their database connections,
// restarts PostgreSQL and NATS and makes the webhook fail, then checks that
// every committed event reached every sink routed to it, in per-key order,
// and that only the events the test made fail for good are dead letters.
//
// The suite runs against a throwaway PostgreSQL cluster (initdb into a
// temporary directory, on a free port) and an in-process NATS server, so its
// restarts disturb no other test. Run it with
//
//	go test -v ./relay/chaos/ [-chaos.seed N] [-chaos.duration 10m]
//
// The seed drives the fault schedule; it is printed at the start and on
// failure (CHAOS_SEED in the environment sets it too).
package chaos
