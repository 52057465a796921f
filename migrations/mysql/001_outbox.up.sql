-- Herald's tables on MySQL 8.0.16+ and MariaDB 10.6+: the model of the
-- PostgreSQL schema at its version 8, in one step. InnoDB, utf8mb4.
--
-- MySQL commits each DDL statement by itself, so a migration is not one
-- transaction: every statement here can run again (IF NOT EXISTS, INSERT
-- IGNORE), and `relay migrate up` run again after a failure completes it.
-- The migrator splits this file into statements at each line that ends
-- with a semicolon: no line inside a statement (comments included) does.
--
-- Times are DATETIME(6) in UTC, defaulting to utc_timestamp(6), whatever the
-- session's time_zone; TIMESTAMP would end in 2038, too soon for a delayed
-- event. utc_timestamp() is the time the INSERT statement began (PostgreSQL's
-- clock_timestamp(), not the transaction's start), which keeps a key's
-- (available_at, seq) order the order of its inserts.

-- The outbox table is Herald's public contract: applications INSERT into it
-- from any language, inside the transaction that makes their business
-- change. Only topic is required; every other column has a default:
--   INSERT INTO outbox (topic, `key`, payload) VALUES ('orders.created', 'order-42', '{"id": 42}')
--
-- id: the UUID in its canonical text form (what PostgreSQL prints and the
-- relay hands to sinks as the dedupe key), readable from every client
-- without conversion; BINARY(16) would save 20 bytes a row, in a table
-- its relays keep near empty. uuid() is a version 1 UUID; the outbox library
-- writes version 7.
-- key: bytes compared as bytes (VARBINARY), as PostgreSQL compares text: a
-- _bin collation of utf8mb4 ignores trailing spaces on MariaDB, and the
-- unique head index of the deliveries needs exact equality. It must hold
-- UTF-8, which the check tests by converting it.
-- topic, key: one character or byte more than allowed, so that a session
-- without strict mode, which truncates what is too long, still meets the
-- check rather than storing a cut value.
-- payload: JSON text, byte for byte, as PostgreSQL's json type keeps it.
-- Not the JSON type: MariaDB's JSON is LONGTEXT with a json_valid() check,
-- which refuses arrays and objects nested 32 levels or deeper (MariaDB
-- 10.11), and MySQL's JSON is a binary form that reorders keys, drops
-- duplicate ones and reprints numbers. The outbox library checks the JSON
-- it writes; the relay dead-letters a payload no sink can send.
-- payload_bin: a payload of any other content type.
-- lane: the key's lane (the id's for an event without a key), computed
-- by the server whoever writes the row.
-- payload_bytes: the payload's size, read by the claim to bound a batch's
-- bytes without reading the payloads.
CREATE TABLE IF NOT EXISTS {{.Outbox}} (
    seq           BIGINT           NOT NULL AUTO_INCREMENT,
    id            VARCHAR(36)      CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT (uuid()),
    topic         VARCHAR(256)     NOT NULL,
    `key`         VARBINARY(1025),
    payload       LONGTEXT,
    payload_bin   LONGBLOB,
    content_type  TEXT,
    headers       LONGTEXT         NOT NULL DEFAULT ('{}'),
    created_at    DATETIME(6)      NOT NULL DEFAULT (utc_timestamp(6)),
    available_at  DATETIME(6)      NOT NULL DEFAULT (utc_timestamp(6)),
    max_attempts  INT,
    status        ENUM('pending', 'done') NOT NULL DEFAULT 'pending',
    finished_at   DATETIME(6),
    lane          TINYINT UNSIGNED AS (crc32(coalesce(`key`, id)) & 63) STORED,
    payload_bytes BIGINT           AS (coalesce(length(payload), 0) + coalesce(length(payload_bin), 0)) STORED,
    PRIMARY KEY (seq),
    -- The event id is the dedupe key downstream; unique among stored rows.
    UNIQUE KEY {{.Name "id_idx"}} (id),
    -- The claim walks pending rows in (available_at, seq) order up to now,
    -- served in index order without a filesort; the lane, last, is tested
    -- on the index entry, so rows of other relays' lanes cost no row read.
    -- status leads because MySQL has no partial index.
    KEY {{.Name "claim_idx"}} (status, available_at, seq, lane),
    -- Delivered rows kept for a retention period go oldest first.
    KEY {{.Name "done_idx"}} (status, finished_at),
    CONSTRAINT {{.Name "id_check"}} CHECK (id REGEXP '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    CONSTRAINT {{.Name "topic_check"}} CHECK (topic <> '' AND length(topic) <= 255),
    CONSTRAINT {{.Name "key_check"}} CHECK (`key` IS NULL OR (`key` <> '' AND length(`key`) <= 1024
        AND convert(convert(`key` USING utf8mb4) USING binary) = `key`)),
    CONSTRAINT {{.Name "payload_check"}} CHECK (payload IS NULL OR payload_bin IS NULL),
    CONSTRAINT {{.Name "headers_check"}} CHECK (json_valid(headers) AND json_type(headers) = 'OBJECT'),
    CONSTRAINT {{.Name "max_attempts_check"}} CHECK (max_attempts IS NULL OR max_attempts > 0),
    -- A session without NO_ZERO_DATE and NO_ZERO_IN_DATE stores dates such
    -- as 0000-00-00 or 2026-00-10, which are not times.
    CONSTRAINT {{.Name "created_at_check"}} CHECK (year(created_at) > 0 AND month(created_at) > 0 AND dayofmonth(created_at) > 0),
    CONSTRAINT {{.Name "available_at_check"}} CHECK (year(available_at) > 0 AND month(available_at) > 0 AND dayofmonth(available_at) > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Per-sink delivery queues, as in PostgreSQL's migration 005: an outbox row
-- is claimed once, and every sink of its route either receives it at once
-- or gets a row here (a delivery). Per sink and key the deliveries form a
-- queue whose head alone is due (state 'ready', next_at set) or is a dead
-- letter stopping its key; the others wait. Sink '' is the routing step.
--
-- MySQL has no partial index: each of PostgreSQL's is a virtual column that
-- is NULL outside the index's condition, indexed (an index entry with a NULL
-- matches no equality lookup and no unique conflict).
CREATE TABLE IF NOT EXISTS {{.Deliveries}} (
    sink          VARCHAR(255)     NOT NULL,
    seq           BIGINT           NOT NULL,
    lane          TINYINT UNSIGNED NOT NULL,
    id            VARCHAR(36)      CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic         VARCHAR(256)     NOT NULL,
    `key`         VARBINARY(1025),
    payload       LONGTEXT,
    payload_bin   LONGBLOB,
    content_type  TEXT,
    headers       LONGTEXT         NOT NULL DEFAULT ('{}'),
    created_at    DATETIME(6)      NOT NULL,
    max_attempts  INT,
    state         ENUM('ready', 'waiting', 'dead') NOT NULL,
    stops_key     BOOLEAN          NOT NULL DEFAULT FALSE,
    attempts      INT              NOT NULL DEFAULT 0,
    next_at       DATETIME(6),
    last_error    TEXT,
    queued_at     DATETIME(6)      NOT NULL DEFAULT (utc_timestamp(6)),
    dead_at       DATETIME(6),
    payload_bytes BIGINT           AS (coalesce(length(payload), 0) + coalesce(length(payload_bin), 0)) STORED,
    -- The key of a queue's head (PostgreSQL's head_idx condition), of a
    -- delivery still in its queue (queue_idx), and the lane of a head
    -- (head_lane_idx); NULL otherwise.
    head_key      VARBINARY(1025)  AS (CASE WHEN `key` IS NOT NULL AND (state = 'ready' OR stops_key) THEN `key` END) VIRTUAL,
    queue_key     VARBINARY(1025)  AS (CASE WHEN `key` IS NOT NULL AND (state <> 'dead' OR stops_key) THEN `key` END) VIRTUAL,
    head_lane     TINYINT UNSIGNED AS (CASE WHEN `key` IS NOT NULL AND (state = 'ready' OR stops_key) THEN lane END) VIRTUAL,
    PRIMARY KEY (sink, seq),
    -- The queue claim: per sink, the due heads in next_at order (next_at
    -- is NULL unless the delivery is ready), the lane tested on the entry.
    KEY {{.Name "due_idx"}} (sink, next_at, lane),
    -- A key's queue on a sink, in seq order.
    KEY {{.Name "queue_idx"}} (queue_key, sink, seq),
    -- At most one head per key and sink: the fact every ordering decision
    -- reads, stored once.
    UNIQUE KEY {{.Name "head_idx"}} (head_key, sink),
    -- The lanes that have any head.
    KEY {{.Name "head_lane_idx"}} (head_lane),
    -- Dead letters are listed and replayed in seq order; events shown by id.
    KEY {{.Name "dead_letter_idx"}} (state, seq),
    KEY {{.Name "delivery_id_idx"}} (id),
    CONSTRAINT {{.Name "delivery_next_check"}} CHECK ((state = 'ready') = (next_at IS NOT NULL)),
    CONSTRAINT {{.Name "delivery_dead_check"}} CHECK ((state = 'dead') = (dead_at IS NOT NULL)),
    CONSTRAINT {{.Name "delivery_stops_check"}} CHECK (state = 'dead' OR NOT stops_key),
    CONSTRAINT {{.Name "delivery_attempts_check"}} CHECK (attempts >= 0),
    CONSTRAINT {{.Name "delivery_lane_check"}} CHECK (lane <= 63)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Lanes partition the key space (crc32 of the key, or of the id, & 63). A
-- relay leases lanes; only it claims their events, so one key is never
-- published by two relays at once.
CREATE TABLE IF NOT EXISTS {{.Lanes}} (
    lane        TINYINT UNSIGNED NOT NULL,
    owner       VARCHAR(255),
    lease_until DATETIME(6),
    PRIMARY KEY (lane),
    CONSTRAINT {{.Name "lanes_lane_check"}} CHECK (lane <= 63)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT IGNORE INTO {{.Lanes}} (lane) VALUES
    (0), (1), (2), (3), (4), (5), (6), (7), (8), (9), (10), (11), (12), (13), (14), (15),
    (16), (17), (18), (19), (20), (21), (22), (23), (24), (25), (26), (27), (28), (29), (30), (31),
    (32), (33), (34), (35), (36), (37), (38), (39), (40), (41), (42), (43), (44), (45), (46), (47),
    (48), (49), (50), (51), (52), (53), (54), (55), (56), (57), (58), (59), (60), (61), (62), (63);

-- Live relays announce themselves here, with a fingerprint of their routes
-- (config) and since when that configuration has been live among the
-- relays (config_since; '1000-01-01', DATETIME's earliest supported value,
-- stands for PostgreSQL's -infinity). paused_sinks is a JSON array.
CREATE TABLE IF NOT EXISTS {{.Relays}} (
    owner           VARCHAR(255) NOT NULL,
    started_at      DATETIME(6)  NOT NULL DEFAULT (utc_timestamp(6)),
    heartbeat_until DATETIME(6)  NOT NULL,
    config          VARCHAR(255) NOT NULL DEFAULT '',
    config_since    DATETIME(6)  NOT NULL DEFAULT '1000-01-01 00:00:00',
    paused_sinks    LONGTEXT     NOT NULL DEFAULT ('[]'),
    PRIMARY KEY (owner),
    -- Every claim looks up the newest configuration among the live relays.
    KEY {{.Name "relays_newest_idx"}} (config_since, config),
    CONSTRAINT {{.Name "relays_paused_check"}} CHECK (json_valid(paused_sinks) AND json_type(paused_sinks) = 'ARRAY')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Published counts per minute, sink and topic, upserted by the relays and
-- read by `relay status`; rows older than a day are removed.
CREATE TABLE IF NOT EXISTS {{.Stats}} (
    minute    DATETIME(6)  NOT NULL,
    sink      VARCHAR(255) NOT NULL,
    topic     VARCHAR(256) NOT NULL,
    published BIGINT       NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, sink, topic)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
