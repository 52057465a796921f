-- Each event's payload size in bytes, computed by PostgreSQL as the row is
-- written, whoever writes it. A claim bounds the bytes it loads
-- (relay.max_batch_bytes) and leaves unloaded a payload past
-- relay.max_event_bytes; reading the size from the payload itself would
-- decompress it, in every claim that looks at the row. Adding a stored
-- generated column rewrites the table, under a lock that makes writers
-- wait: an outbox is near empty when its relays keep up.
ALTER TABLE {{.Outbox}}
    ADD COLUMN payload_bytes integer NOT NULL
        GENERATED ALWAYS AS (coalesce(octet_length(payload::text), 0) + coalesce(octet_length(payload_bin), 0)) STORED;
ALTER TABLE {{.Deliveries}}
    ADD COLUMN payload_bytes integer NOT NULL
        GENERATED ALWAYS AS (coalesce(octet_length(payload::text), 0) + coalesce(octet_length(payload_bin), 0)) STORED;
