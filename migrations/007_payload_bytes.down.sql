ALTER TABLE {{.Outbox}} DROP COLUMN payload_bytes;
ALTER TABLE {{.Deliveries}} DROP COLUMN payload_bytes;
