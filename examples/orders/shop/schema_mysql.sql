-- The orders table of the example order service on MySQL and MariaDB.
-- Applied at start with IF NOT EXISTS, in the database the service is
-- configured with. Times are UTC (the service writes utc_timestamp(6)).
CREATE TABLE IF NOT EXISTS {{.Orders}} (
    id             CHAR(36)      CHARACTER SET ascii NOT NULL PRIMARY KEY,
    customer_name  VARCHAR(200)  NOT NULL CHECK (customer_name <> ''),
    customer_email VARCHAR(200)  NOT NULL CHECK (customer_email <> ''),
    -- [{"name": "Widget", "qty": 2, "price_cents": 1250}, ...]
    items          JSON          NOT NULL CHECK (json_type(items) = 'ARRAY'),
    total_cents    BIGINT        NOT NULL CHECK (total_cents >= 0),
    currency       CHAR(3)       CHARACTER SET ascii COLLATE ascii_bin NOT NULL CHECK (currency REGEXP '^[A-Z]{3}$'),
    status         VARCHAR(16)   CHARACTER SET ascii NOT NULL DEFAULT 'created' CHECK (status IN ('created', 'paid')),
    created_at     DATETIME(6)   NOT NULL,
    paid_at        DATETIME(6)   NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
