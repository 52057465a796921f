-- Back to version 4: each event with deliveries becomes an outbox row again,
-- its per-sink state in the deliveries column and its queue positions as
-- holds. Sinks that had already received an event are not recorded here, so
-- a relay of version 4 sends it to them again (consumers dedupe by id).
DO $$
DECLARE
    live text;
BEGIN
    SELECT string_agg(owner, ', ') INTO live FROM {{.Relays}} WHERE heartbeat_until > now();
    IF live IS NOT NULL THEN
        RAISE EXCEPTION 'relays are running on this outbox (%): stop them before reverting migration 005', live;
    END IF;
END $$;

ALTER TABLE {{.Outbox}}
    DROP CONSTRAINT {{.Name "status_check"}},
    ADD CONSTRAINT {{.Name "status_check"}} CHECK (status IN ('pending', 'done', 'dead')),
    ADD COLUMN attempts    integer NOT NULL DEFAULT 0,
    ADD COLUMN last_error  text,
    ADD COLUMN deliveries  jsonb   NOT NULL DEFAULT '{}',
    ADD COLUMN lease_owner text,
    ADD COLUMN lease_until timestamptz,
    ADD CONSTRAINT {{.Name "deliveries_check"}} CHECK (jsonb_typeof(deliveries) = 'object'),
    ADD CONSTRAINT {{.Name "attempts_check"}} CHECK (attempts >= 0);
CREATE INDEX {{.Name "dead_idx"}} ON {{.Outbox}} (seq) WHERE status = 'dead';

CREATE TABLE {{.Holds}} (
    key   text        NOT NULL,
    sink  text        NOT NULL,
    seq   bigint      NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (key, sink, seq)
);

-- One row per event: dead when every delivery of it is dead.
WITH ev AS (
    SELECT d.seq, min(d.id::text)::uuid AS id, min(d.topic) AS topic, min(d.key) AS key,
           (array_agg(d.payload::text))[1]::json AS payload, (array_agg(d.payload_bin))[1] AS payload_bin,
           min(d.content_type) AS content_type, (array_agg(d.headers))[1] AS headers,
           min(d.created_at) AS created_at, min(d.max_attempts) AS max_attempts,
           bool_and(d.state = 'dead') AS dead, max(d.attempts) AS attempts,
           string_agg(CASE WHEN d.sink = '' THEN d.last_error ELSE d.sink || ': ' || d.last_error END, '; ')
               FILTER (WHERE d.last_error IS NOT NULL) AS last_error,
           coalesce(jsonb_object_agg(d.sink, jsonb_build_object(
               'state', CASE d.state WHEN 'dead' THEN 'dead' WHEN 'ready' THEN 'retry' ELSE 'wait' END,
               'attempts', d.attempts, 'error', coalesce(d.last_error, ''),
               'at', coalesce(d.dead_at, d.queued_at),
               'next', coalesce(d.next_at, now()))) FILTER (WHERE d.sink <> ''), '{}') AS deliveries,
           min(coalesce(d.next_at, now())) AS available_at, max(d.dead_at) AS dead_at
    FROM {{.Deliveries}} d
    GROUP BY d.seq
), kept AS (
    UPDATE {{.Outbox}} o
    SET status = CASE WHEN ev.dead THEN 'dead' ELSE 'pending' END, attempts = ev.attempts,
        last_error = ev.last_error, deliveries = ev.deliveries, available_at = ev.available_at,
        finished_at = CASE WHEN ev.dead THEN ev.dead_at END
    FROM ev WHERE o.seq = ev.seq
    RETURNING o.seq
)
INSERT INTO {{.Outbox}} (seq, id, topic, key, payload, payload_bin, content_type, headers, created_at,
    available_at, attempts, max_attempts, status, last_error, deliveries, finished_at)
OVERRIDING SYSTEM VALUE
SELECT ev.seq, ev.id, ev.topic, ev.key, ev.payload, ev.payload_bin, ev.content_type, ev.headers, ev.created_at,
       ev.available_at, ev.attempts, ev.max_attempts, CASE WHEN ev.dead THEN 'dead' ELSE 'pending' END,
       ev.last_error, ev.deliveries, CASE WHEN ev.dead THEN ev.dead_at END
FROM ev WHERE ev.seq NOT IN (SELECT seq FROM kept);

-- Queue positions become holds: a waiting delivery holds its key and sink
-- until it is sent; a dead letter that stops its key holds it for good.
INSERT INTO {{.Holds}} (key, sink, seq, until)
SELECT key, sink, seq, CASE WHEN stops_key THEN 'infinity' ELSE coalesce(next_at, now()) END
FROM {{.Deliveries}}
WHERE key IS NOT NULL AND sink <> '' AND (state <> 'dead' OR stops_key);

DROP TABLE {{.Deliveries}};
