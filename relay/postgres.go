package relay

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/relay/internal/pgstore"
	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/heraldhq/herald/relay/internal/walcapture"
)

// This file is the relay's PostgreSQL entry point, and the only file of the
// engine that knows pgx: the engine reaches the database through the store
// interface (relay/internal/store), whose PostgreSQL implementation is
// relay/internal/pgstore (TestEngineKnowsNoDriver).

// NewPostgres returns a relay on a PostgreSQL pool, publishing through the sinks
// named in cfg.Routes. Give it a pool of its own (see PoolSize and
// ConfigurePool).
func NewPostgres(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := newRelay(pgstore.New(pool, cfg.Tables), cfg)
	if cfg.Capture == CaptureWAL {
		tables := cfg.Tables.WithDefaults()
		conn := pool.Config().ConnConfig.Config.Copy()
		r.readLog(func() store.Capture {
			return walcapture.New(walcapture.Config{Conn: conn, Slot: cfg.Slot, Publication: tables.PublicationName(),
				Prefix: tables.MessagePrefix(), Buffer: 4 * cfg.BatchSize, Logger: r.log})
		})
	}
	if conns, least := pool.Config().MaxConns, PoolSize(cfg.Workers)-1; conns < least {
		r.log.Warn("relay: the connection pool is smaller than the relay needs; its loops will wait for each other",
			"max_conns", conns, "needed", PoolSize(cfg.Workers))
	}
	return r, nil
}

// PoolSize is the number of connections a relay with this many workers
// (Config.Workers, after defaults) uses at once: one per claim loop, one held
// by LISTEN, one for upkeep and vacuum, one for the admin server's and
// metrics' reads. Give the relay a pool of its own with at least this many
// (pgxpool's default, max(4, number of CPUs), is often fewer).
func PoolSize(workers int) int32 { return int32(workers) + 3 }

// ConfigurePool sets the session settings a relay's connections should use,
// unless the URL already chose them: synchronous_commit=off,
// plan_cache_mode=force_generic_plan, jit=off and
// application_name=herald-relay (relay/internal/pgstore says why each).
// Apply it only to a pool dedicated to the relay: on a pool the application
// shares, synchronous_commit=off would make the application's own commits
// asynchronous too. A relay only writes bookkeeping (outcomes, deliveries,
// lanes); if PostgreSQL crashes before such a commit reaches disk, the rows
// reappear as they were and the events are delivered again, never lost.
func ConfigurePool(cfg *pgxpool.Config) { pgstore.ConfigurePool(cfg) }
