-- Per-sink delivery queues. An outbox row is claimed once: every sink of its
-- route either receives it at once or gets a row of its own here (a
-- delivery), and the outbox row goes. Per sink and key, the deliveries form a
-- queue in which only the head is ever due (state 'ready', next_at set); the
-- others wait without a time of their own (state 'waiting') and are never
-- rewritten until they become the head. Dead letters are deliveries in state
-- 'dead'; one that stops its key (relay.stop_key_on_dead_letter) stays the
-- head of its queue until an operator replays or purges it. The sink named ''
-- is the step before every sink: an event that matched no route or could not
-- be read waits or dies there, and is routed again when replayed.
--
-- The per-sink state of schema version 4 (the deliveries column and the
-- holds table) moves here, so nothing is stranded by the upgrade. Relays of
-- the earlier version must be stopped first: they would keep writing it.
DO $$
DECLARE
    live text;
BEGIN
    SELECT string_agg(owner, ', ') INTO live FROM {{.Relays}} WHERE heartbeat_until > now();
    IF live IS NOT NULL THEN
        RAISE EXCEPTION 'relays are running on this outbox (%): stop them before applying migration 005', live;
    END IF;
END $$;

CREATE TABLE {{.Deliveries}} (
    sink         text        NOT NULL,
    seq          bigint      NOT NULL,
    lane         smallint    NOT NULL,
    id           uuid        NOT NULL,
    topic        text        NOT NULL,
    key          text,
    payload      json,
    payload_bin  bytea,
    content_type text,
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL,
    max_attempts integer,
    state        text        NOT NULL,
    stops_key    boolean     NOT NULL DEFAULT false,
    attempts     integer     NOT NULL DEFAULT 0,
    next_at      timestamptz,
    last_error   text,
    queued_at    timestamptz NOT NULL DEFAULT now(),
    dead_at      timestamptz,
    PRIMARY KEY (sink, seq),
    CHECK (state IN ('ready', 'waiting', 'dead')),
    CHECK ((state = 'ready') = (next_at IS NOT NULL)),
    CHECK ((state = 'dead') = (dead_at IS NOT NULL)),
    CHECK (state = 'dead' OR NOT stops_key),
    CHECK (attempts >= 0),
    CHECK (lane BETWEEN 0 AND 63)
);

-- The queue claim: per sink, the due heads of a relay's lanes in next_at
-- order, the lane range tested on the index entry (as the outbox claim does).
CREATE INDEX {{.Name "due_idx"}} ON {{.Deliveries}} (sink, next_at, lane) WHERE state = 'ready';

-- A key's queue on a sink, in seq order: the followers claimed with their
-- head, and the next one made due when the head leaves.
CREATE INDEX {{.Name "queue_idx"}} ON {{.Deliveries}} (key, sink, seq)
    WHERE key IS NOT NULL AND (state <> 'dead' OR stops_key);

-- Dead letters are listed and replayed in seq order; events are shown by id.
CREATE INDEX {{.Name "dead_letter_idx"}} ON {{.Deliveries}} (seq, sink) WHERE state = 'dead';
CREATE INDEX {{.Name "delivery_id_idx"}} ON {{.Deliveries}} (id);

ALTER TABLE {{.Deliveries}} SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);

-- Version 4's per-sink states: retry (failed or its sink down, due at next),
-- wait (parked behind an earlier event of its key), dead and done. A dead one
-- stopped its key when a hold until 'infinity' was kept for it.
INSERT INTO {{.Deliveries}} (sink, seq, lane, id, topic, key, payload, payload_bin, content_type,
    headers, created_at, max_attempts, state, stops_key, attempts, last_error, queued_at, dead_at)
SELECT d.key, o.seq, hashtext(coalesce(o.key, o.id::text)) & 63, o.id, o.topic, o.key, o.payload,
       o.payload_bin, o.content_type, o.headers, o.created_at, o.max_attempts,
       CASE WHEN d.value->>'state' = 'dead' THEN 'dead' ELSE 'waiting' END,
       d.value->>'state' = 'dead' AND EXISTS (
           SELECT 1 FROM {{.Holds}} h
           WHERE h.key = o.key AND h.sink = d.key AND h.seq = o.seq AND h.until = 'infinity'),
       coalesce((d.value->>'attempts')::int, 0),
       nullif(d.value->>'error', ''),
       now(),
       CASE WHEN d.value->>'state' = 'dead' THEN coalesce(o.finished_at, now()) END
FROM {{.Outbox}} o, jsonb_each(o.deliveries) AS d(key, value)
WHERE o.status IN ('pending', 'dead') AND d.value->>'state' IN ('retry', 'wait', 'dead');

-- Events dead before any sink (no route, unreadable): the routing step ''.
INSERT INTO {{.Deliveries}} (sink, seq, lane, id, topic, key, payload, payload_bin, content_type,
    headers, created_at, max_attempts, state, attempts, last_error, dead_at)
SELECT '', o.seq, hashtext(coalesce(o.key, o.id::text)) & 63, o.id, o.topic, o.key, o.payload,
       o.payload_bin, o.content_type, o.headers, o.created_at, o.max_attempts,
       'dead', o.attempts, o.last_error, coalesce(o.finished_at, now())
FROM {{.Outbox}} o
WHERE o.status = 'dead'
  AND NOT EXISTS (SELECT 1 FROM jsonb_each(o.deliveries) AS d(key, value) WHERE d.value->>'state' = 'dead');

-- Each queue's head: the dead letter stopping it if there is one (the
-- lowest, should there be several), else the lowest waiting delivery, due at
-- its own retry time (a parked one at once). Events without a key are each a
-- queue of their own.
UPDATE {{.Deliveries}} x SET stops_key = false
WHERE x.stops_key AND EXISTS (
    SELECT 1 FROM {{.Deliveries}} y WHERE y.key = x.key AND y.sink = x.sink AND y.stops_key AND y.seq < x.seq);
UPDATE {{.Deliveries}} x
SET state = 'ready',
    next_at = CASE WHEN o.deliveries -> x.sink ->> 'state' = 'retry'
                   THEN least(coalesce((o.deliveries -> x.sink ->> 'next')::timestamptz, o.available_at), now() + interval '1 day')
                   ELSE now() END
FROM {{.Outbox}} o
WHERE o.seq = x.seq AND x.state = 'waiting'
  AND (x.key IS NULL OR NOT EXISTS (
      SELECT 1 FROM {{.Deliveries}} y
      WHERE y.key = x.key AND y.sink = x.sink
        AND ((y.seq < x.seq AND y.state = 'waiting') OR y.stops_key)));

-- At most one head per key and sink: the fact every ordering decision reads,
-- stored once. A new event looks here to learn whether it must join a queue.
CREATE UNIQUE INDEX {{.Name "head_idx"}} ON {{.Deliveries}} (key, sink)
    WHERE key IS NOT NULL AND (state = 'ready' OR stops_key);
-- The lanes that have any head: a claim looks events up in head_idx only
-- in those lanes, so that one key's queue does not cost every other key.
CREATE INDEX {{.Name "head_lane_idx"}} ON {{.Deliveries}} (lane)
    WHERE key IS NOT NULL AND (state = 'ready' OR stops_key);

DELETE FROM {{.Outbox}} o
WHERE o.status = 'dead' OR (o.status = 'pending' AND EXISTS (
    SELECT 1 FROM {{.Deliveries}} x WHERE x.seq = o.seq));

DROP TABLE {{.Holds}};
DROP INDEX {{.Index "dead_idx"}};
ALTER TABLE {{.Outbox}}
    DROP COLUMN attempts,
    DROP COLUMN last_error,
    DROP COLUMN deliveries,
    DROP COLUMN lease_owner,
    DROP COLUMN lease_until,
    DROP CONSTRAINT {{.Name "status_check"}},
    ADD CONSTRAINT {{.Name "status_check"}} CHECK (status IN ('pending', 'done'));
