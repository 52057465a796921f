-- Relays sharing an outbox must route alike: an event claimed by a relay
-- that does not know a sink never reaches it. Each relay announces a
-- fingerprint of its routes (config) and since when that configuration has
-- been live among the relays (config_since); only relays with the newest
-- configuration claim, so during a rolling change no event is routed by the
-- configuration being replaced. paused_sinks shows which sinks each relay
-- holds paused because they are down (relay status).
ALTER TABLE {{.Relays}}
    ADD COLUMN config       text        NOT NULL DEFAULT '',
    ADD COLUMN config_since timestamptz NOT NULL DEFAULT '-infinity',
    ADD COLUMN paused_sinks text[]      NOT NULL DEFAULT '{}';

-- Every claim looks up the newest configuration among the live relays.
CREATE INDEX {{.Name "relays_newest_idx"}} ON {{.Relays}} (config_since DESC, config);
