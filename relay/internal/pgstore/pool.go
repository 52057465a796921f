package pgstore

import "github.com/jackc/pgx/v5/pgxpool"

// ConfigurePool sets the session settings a relay's connections should use,
// unless the URL already chose them (relay.ConfigurePool).
//
//   - synchronous_commit=off. A relay only writes bookkeeping (outcomes,
//     deliveries, lanes); if PostgreSQL crashes before such a commit reaches
//     disk, the rows reappear as they were and the events are delivered
//     again. Nothing is lost: the events themselves were committed durably
//     by their producers. It spares every claim and record a WAL flush,
//     which is most of their latency.
//   - plan_cache_mode=force_generic_plan. The relay runs the same few
//     prepared statements thousands of times a second; PostgreSQL would
//     otherwise plan the claim afresh on each call (about 1–2 ms, more than
//     executing it on a small table). Its generic plan walks the claim index
//     like the custom one, checked on a 200,000-event backlog.
//   - jit=off. The relay's statements read a batch's rows through indexes
//     in milliseconds; compiling one takes longer than running it, and
//     PostgreSQL decides to compile from cost estimates that a table
//     without a usable index can inflate (claims once took two seconds
//     each, all of it compiling). The claims and records turn it off for
//     themselves too.
//   - application_name=herald-relay, so operators can find relay sessions.
func ConfigurePool(cfg *pgxpool.Config) {
	params := cfg.ConnConfig.RuntimeParams
	if _, ok := params["synchronous_commit"]; !ok {
		params["synchronous_commit"] = "off"
	}
	if _, ok := params["plan_cache_mode"]; !ok {
		params["plan_cache_mode"] = "force_generic_plan"
	}
	if _, ok := params["jit"]; !ok {
		params["jit"] = "off"
	}
	if _, ok := params["application_name"]; !ok {
		params["application_name"] = "herald-relay"
	}
}
