-- Message traces across regions (docs/multi-region.md): an outbox row of a traced
-- message is marked in the commit's transaction, and its replication record carries
-- `traced`, so the publisher and the other regions' appliers record their stages.
ALTER TABLE region_outbox ADD COLUMN traced BOOLEAN NOT NULL DEFAULT FALSE;
