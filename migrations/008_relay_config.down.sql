DROP INDEX {{.Index "relays_newest_idx"}};
ALTER TABLE {{.Relays}}
    DROP COLUMN config,
    DROP COLUMN config_since,
    DROP COLUMN paused_sinks;
