-- The outbox table is Herald's public contract: applications INSERT into it
-- from any language, inside the transaction that makes their business change.
-- Only topic is required; every other column has a default.
CREATE TABLE {{.Outbox}} (
    seq          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           uuid        NOT NULL DEFAULT gen_random_uuid(),
    topic        text        NOT NULL,
    key          text,
    payload      json,
    payload_bin  bytea,
    content_type text,
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(),
    attempts     integer     NOT NULL DEFAULT 0,
    max_attempts integer,
    status       text        NOT NULL DEFAULT 'pending',
    last_error   text,
    deliveries   jsonb       NOT NULL DEFAULT '{}',
    lease_owner  text,
    lease_until  timestamptz,
    finished_at  timestamptz,
    CONSTRAINT {{.Name "topic_check"}} CHECK (topic <> '' AND octet_length(topic) <= 255),
    CONSTRAINT {{.Name "key_check"}} CHECK (key IS NULL OR (key <> '' AND octet_length(key) <= 1024)),
    CONSTRAINT {{.Name "payload_check"}} CHECK (payload IS NULL OR payload_bin IS NULL),
    CONSTRAINT {{.Name "headers_check"}} CHECK (jsonb_typeof(headers) = 'object'),
    CONSTRAINT {{.Name "deliveries_check"}} CHECK (jsonb_typeof(deliveries) = 'object'),
    CONSTRAINT {{.Name "status_check"}} CHECK (status IN ('pending', 'done', 'dead')),
    CONSTRAINT {{.Name "attempts_check"}} CHECK (attempts >= 0),
    CONSTRAINT {{.Name "max_attempts_check"}} CHECK (max_attempts IS NULL OR max_attempts > 0)
);

-- The event id is the dedupe key downstream; it is unique among stored rows.
CREATE UNIQUE INDEX {{.Name "id_idx"}} ON {{.Outbox}} (id);

-- The claim scans pending rows in (available_at, seq) order and stops at now():
-- delayed events and rows waiting for a retry are never read before they are due.
CREATE INDEX {{.Name "claim_idx"}} ON {{.Outbox}} (available_at, seq) WHERE status = 'pending';

-- Dead letters are listed and replayed by topic, key, sink and error.
CREATE INDEX {{.Name "dead_idx"}} ON {{.Outbox}} (seq) WHERE status = 'dead';

-- Delivered rows kept for a retention period are removed oldest first.
CREATE INDEX {{.Name "done_idx"}} ON {{.Outbox}} (finished_at) WHERE status = 'done';

-- A queue table churns: vacuum it after a fixed number of dead tuples rather
-- than a fraction of its (small, varying) size, and without cost throttling.
-- Free space on each page lets the claim's lease update stay on the page
-- (a HOT update: no new index entries).
ALTER TABLE {{.Outbox}} SET (
    fillfactor = 60,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0
);

-- A hold marks an event that failed on one sink and is waiting for its retry:
-- later events of the same key are not sent to that sink until it clears.
CREATE TABLE {{.Holds}} (
    key   text        NOT NULL,
    sink  text        NOT NULL,
    seq   bigint      NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (key, sink, seq)
);

-- Lanes partition the key space (hashtext(key) & 63). A relay leases lanes and
-- only it claims keyed events of those lanes, so one key is never published by
-- two relays at once. Events without a key belong to no lane.
CREATE TABLE {{.Lanes}} (
    lane        smallint PRIMARY KEY,
    owner       text,
    lease_until timestamptz
);
INSERT INTO {{.Lanes}} (lane) SELECT generate_series(0, 63);

-- Live relays announce themselves here; each takes a fair share of the lanes.
CREATE TABLE {{.Relays}} (
    owner           text        PRIMARY KEY,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_until timestamptz NOT NULL
);
