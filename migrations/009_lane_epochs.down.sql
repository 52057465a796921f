ALTER TABLE {{.Lanes}} DROP COLUMN epoch;
