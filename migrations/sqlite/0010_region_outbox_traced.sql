-- Multi-region replication needs Postgres; the column exists here only so both
-- engines keep one schema version.
ALTER TABLE region_outbox ADD COLUMN traced BOOLEAN NOT NULL DEFAULT FALSE;
