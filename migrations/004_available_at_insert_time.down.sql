ALTER TABLE {{.Outbox}} ALTER COLUMN available_at SET DEFAULT now();
