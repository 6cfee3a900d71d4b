-- Multi-region replication needs Postgres (the config refuses `region` with SQLite);
-- the table exists here only so both engines keep one schema version.
CREATE TABLE region_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    seq BIGINT NOT NULL
);
