-- outbox_emit cost the server about 19 µs an event where an INSERT into
-- the table cost 8 (relay bench, one 200,000-event transaction). Three
-- things made it slow: the sequence was looked up by name at every call
-- (pg_get_serial_sequence scans pg_depend), json_build_object renders its
-- arguments through generic type lookups, and every PL/pgSQL statement
-- (seven IFs and a PERFORM) is a trip through the executor. The function is
-- now one RETURN of one expression, which PL/pgSQL evaluates on its fast
-- path: the checks are the CASE's first branches (they raise through
-- outbox_emit_refuse), a delayed event goes to the table through
-- outbox_emit_delayed, and the message is assembled from its parts, each
-- rendered as json_build_object renders it (to_json for text and times, a
-- jsonb's own text): the same text as before. The sequence is named once,
-- here, after checking that it is the identity column's.

DO $check$
BEGIN
    IF pg_get_serial_sequence({{.Literal .Outbox}}, 'seq')::regclass <> {{.Literal (.Index "seq_seq")}}::regclass THEN
        RAISE EXCEPTION 'the sequence of %.seq is %, not %', {{.Literal .Outbox}},
            pg_get_serial_sequence({{.Literal .Outbox}}, 'seq'), {{.Literal (.Index "seq_seq")}};
    END IF;
END
$check$;

CREATE FUNCTION {{.Index "emit_refuse"}}(code text, message text) RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = message, ERRCODE = code;
END
$$;

CREATE FUNCTION {{.Index "emit_delayed"}}(event_id uuid, topic text, key text, payload jsonb, payload_bin bytea,
    content_type text, headers jsonb, delay interval, max_attempts integer) RETURNS uuid
LANGUAGE sql AS $$
    INSERT INTO {{.Outbox}} (id, topic, key, payload, payload_bin, content_type, headers, available_at, max_attempts)
    VALUES (event_id, topic, key, payload::json, payload_bin, content_type, headers, clock_timestamp() + delay, max_attempts)
    RETURNING id
$$;

CREATE OR REPLACE FUNCTION {{.EmitEvent}}(event_id uuid, topic text, key text, payload jsonb, payload_bin bytea,
    content_type text, headers jsonb, delay interval, max_attempts integer) RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE
    WHEN event_id IS NULL THEN
        {{.Index "emit_refuse"}}('23502', 'outbox_emit: id must not be null')
    WHEN topic IS NULL OR topic = '' OR octet_length(topic) > 255 THEN
        {{.Index "emit_refuse"}}('23514', format('outbox_emit: topic must be 1 to 255 bytes, got %s', coalesce(octet_length(topic), 0)))
    WHEN key IS NOT NULL AND (key = '' OR octet_length(key) > 1024) THEN
        {{.Index "emit_refuse"}}('23514', format('outbox_emit: key must be NULL or 1 to 1024 bytes, got %s', octet_length(key)))
    WHEN payload IS NOT NULL AND payload_bin IS NOT NULL THEN
        {{.Index "emit_refuse"}}('23514', 'outbox_emit: an event has a JSON payload or a binary one, not both')
    WHEN headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        {{.Index "emit_refuse"}}('23514', 'outbox_emit: headers must be a JSON object')
    WHEN max_attempts IS NOT NULL AND max_attempts < 1 THEN
        {{.Index "emit_refuse"}}('23514', format('outbox_emit: max_attempts must be positive, got %s', max_attempts))
    WHEN delay > interval '0' THEN
        {{.Index "emit_delayed"}}(event_id, topic, key, payload, payload_bin, content_type, headers, delay, max_attempts)
    WHEN pg_logical_emit_message(true, {{.Literal .MessagePrefix}},
        '{"seq" : ' || nextval({{.Literal (.Index "seq_seq")}}::regclass)
        || ', "id" : "' || event_id
        || '", "topic" : ' || to_json(topic)::text
        || ', "key" : ' || coalesce(to_json(key)::text, 'null')
        || ', "lane" : ' || (hashtext(coalesce(key, event_id::text)) & 63)
        || ', "payload" : ' || coalesce(payload::text, 'null')
        || ', "payload_bin" : ' || coalesce('"' || translate(encode(payload_bin, 'base64'), E'\n', '') || '"', 'null')
        || ', "content_type" : ' || coalesce(to_json(content_type)::text, 'null')
        || ', "headers" : ' || headers::text
        || ', "created_at" : ' || to_json(now())::text
        || ', "max_attempts" : ' || coalesce(max_attempts::text, 'null')
        || '}') IS NOT NULL THEN
        event_id
    END;
END
$$;
