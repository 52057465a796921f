-- The times a writer may set must be times. created_at is when the event's
-- transaction began: 'infinity', '-infinity' or a date outside years 1 to
-- 9999 (which PostgreSQL stores, but RFC 3339 and JSON cannot carry) is
-- refused. available_at is the earliest time to publish: '-infinity' means
-- at once and a far future date a long delay, but 'infinity' would never
-- come, so it is refused too. NOT VALID: rows already in the table are not
-- checked here (the relay dead-letters an event whose created_at it cannot
-- read, with the reason), and adding the constraints takes no time.
ALTER TABLE {{.Outbox}}
    ADD CONSTRAINT {{.Name "created_at_check"}}
        CHECK (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT {{.Name "available_at_check"}} CHECK (available_at < 'infinity') NOT VALID;
