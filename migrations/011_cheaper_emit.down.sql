-- outbox_emit as migration 010 made it.

CREATE OR REPLACE FUNCTION {{.EmitEvent}}(event_id uuid, topic text, key text, payload jsonb, payload_bin bytea,
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

DROP FUNCTION {{.Index "emit_delayed"}}(uuid, text, text, jsonb, bytea, text, jsonb, interval, integer);
DROP FUNCTION {{.Index "emit_refuse"}}(text, text);
