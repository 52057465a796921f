-- Drops every table of the first version, with its rows.
DROP TABLE IF EXISTS {{.Stats}};
DROP TABLE IF EXISTS {{.Relays}};
DROP TABLE IF EXISTS {{.Lanes}};
DROP TABLE IF EXISTS {{.Deliveries}};
DROP TABLE IF EXISTS {{.Outbox}};
