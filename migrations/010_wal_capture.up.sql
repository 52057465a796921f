-- Events written to the write-ahead log instead of the table (a relay
-- with database.capture: wal reads them from a logical replication slot).
-- outbox_emit(topic, key, payload, headers) in the application's
-- transaction emits the event as a transactional logical decoding message:
-- it exists only in the WAL, and is decoded, in commit order, only if the
-- transaction commits. It validates like the table's constraints, draws
-- the event's seq from the table's sequence (so that events written either
-- way keep one order), and returns the event's id. An event with a delay
-- is written to the table instead, where relays find it once it is due.

CREATE FUNCTION {{.EmitEvent}}(event_id uuid, topic text, key text, payload jsonb, payload_bin bytea,
    content_type text, headers jsonb, delay interval, max_attempts integer) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    event_seq bigint;
BEGIN
    IF event_id IS NULL THEN
        RAISE EXCEPTION 'outbox_emit: id must not be null' USING ERRCODE = 'not_null_violation';
    END IF;
    IF topic IS NULL OR topic = '' OR octet_length(topic) > 255 THEN
        RAISE EXCEPTION 'outbox_emit: topic must be 1 to 255 bytes, got %', coalesce(octet_length(topic), 0)
            USING ERRCODE = 'check_violation';
    END IF;
    IF key IS NOT NULL AND (key = '' OR octet_length(key) > 1024) THEN
        RAISE EXCEPTION 'outbox_emit: key must be NULL or 1 to 1024 bytes, got %', octet_length(key)
            USING ERRCODE = 'check_violation';
    END IF;
    IF payload IS NOT NULL AND payload_bin IS NOT NULL THEN
        RAISE EXCEPTION 'outbox_emit: an event has a JSON payload or a binary one, not both'
            USING ERRCODE = 'check_violation';
    END IF;
    IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox_emit: headers must be a JSON object' USING ERRCODE = 'check_violation';
    END IF;
    IF max_attempts IS NOT NULL AND max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox_emit: max_attempts must be positive, got %', max_attempts
            USING ERRCODE = 'check_violation';
    END IF;
    IF delay IS NOT NULL AND delay > interval '0' THEN
        INSERT INTO {{.Outbox}} (id, topic, key, payload, payload_bin, content_type, headers, available_at, max_attempts)
        VALUES (event_id, topic, key, payload::json, payload_bin, content_type, headers, clock_timestamp() + delay, max_attempts);
        RETURN event_id;
    END IF;
    event_seq := nextval(pg_get_serial_sequence({{.Literal .Outbox}}, 'seq'));
    PERFORM pg_logical_emit_message(true, {{.Literal .MessagePrefix}}, json_build_object(
        'seq', event_seq, 'id', event_id, 'topic', topic, 'key', key,
        'lane', hashtext(coalesce(key, event_id::text)) & 63,
        'payload', payload, 'payload_bin', translate(encode(payload_bin, 'base64'), E'\n', ''),
        'content_type', content_type, 'headers', headers, 'created_at', now(),
        'max_attempts', max_attempts)::text);
    RETURN event_id;
END
$$;

-- The events' functions for applications.
CREATE FUNCTION {{.Emit}}(topic text, key text, payload jsonb, headers jsonb DEFAULT '{}',
    delay interval DEFAULT NULL, max_attempts integer DEFAULT NULL) RETURNS uuid
LANGUAGE sql AS $$
    SELECT {{.EmitEvent}}(gen_random_uuid(), topic, key, payload, NULL, NULL, headers, delay, max_attempts)
$$;

CREATE FUNCTION {{.EmitBytes}}(topic text, key text, payload bytea, content_type text DEFAULT 'application/octet-stream',
    headers jsonb DEFAULT '{}', delay interval DEFAULT NULL, max_attempts integer DEFAULT NULL) RETURNS uuid
LANGUAGE sql AS $$
    SELECT {{.EmitEvent}}(gen_random_uuid(), topic, key, NULL, payload, content_type, headers, delay, max_attempts)
$$;

-- What a relay's replication slot subscribes with: pgoutput sends the
-- logical decoding messages of every transaction; the publication names no
-- table, so no row change is decoded for it. Publications belong to the
-- database, not the schema: one left by a schema dropped without migrating
-- down is taken over rather than failing the migration.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {{.PublicationLiteral}}) THEN
        CREATE PUBLICATION {{.Publication}};
    END IF;
END
$$;
