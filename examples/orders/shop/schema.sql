-- The orders table of the example order service. Applied at start with
-- IF NOT EXISTS, in the schema the service is configured with.
CREATE SCHEMA IF NOT EXISTS {{.Schema}};

CREATE TABLE IF NOT EXISTS {{.Orders}} (
    id             uuid        PRIMARY KEY,
    customer_name  text        NOT NULL CHECK (customer_name <> ''),
    customer_email text        NOT NULL CHECK (customer_email <> ''),
    -- [{"name": "Widget", "qty": 2, "price_cents": 1250}, ...]
    items          jsonb       NOT NULL CHECK (jsonb_typeof(items) = 'array'),
    total_cents    bigint      NOT NULL CHECK (total_cents >= 0),
    currency       text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status         text        NOT NULL DEFAULT 'created' CHECK (status IN ('created', 'paid')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    paid_at        timestamptz
);
