ALTER TABLE {{.Outbox}}
    DROP CONSTRAINT {{.Name "created_at_check"}},
    DROP CONSTRAINT {{.Name "available_at_check"}};
