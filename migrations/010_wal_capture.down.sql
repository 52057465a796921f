DROP PUBLICATION IF EXISTS {{.Publication}};
DROP FUNCTION {{.EmitBytes}}(text, text, bytea, text, jsonb, interval, integer);
DROP FUNCTION {{.Emit}}(text, text, jsonb, jsonb, interval, integer);
DROP FUNCTION {{.EmitEvent}}(uuid, text, text, jsonb, bytea, text, jsonb, interval, integer);
