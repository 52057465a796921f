-- An event is due from the time of its INSERT, not of its transaction's
-- start (now()). The claim takes due events in (available_at, seq) order,
-- one batch at a time; with now(), a transaction that began first but
-- enqueued second (it waited for the aggregate's row lock) wrote the higher
-- seq with the earlier available_at, and a batch ending between the two
-- events published the key out of seq order. At insert time, writers
-- serialised on the aggregate's lock enqueue in both orders at once.
ALTER TABLE {{.Outbox}} ALTER COLUMN available_at SET DEFAULT clock_timestamp();
