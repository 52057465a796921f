-- Published counts per minute, sink and topic. Each relay aggregates in
-- memory and upserts here every few seconds; `relay status` reads it to show
-- what was published in the last minute (delivered rows are usually deleted,
-- so the outbox table cannot tell). Rows older than a day are removed by the
-- relays' flush.
CREATE TABLE {{.Stats}} (
    minute    timestamptz NOT NULL,
    sink      text        NOT NULL,
    topic     text        NOT NULL,
    published bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, sink, topic)
);
