-- Multi-region replication of cursors needs Postgres (the config refuses `region` with
-- SQLite); the table exists here only so both engines keep one schema version.
CREATE TABLE region_cursor_outbox (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    kind INTEGER NOT NULL,
    seq BIGINT NOT NULL,
    at BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, conversation_id, kind)
);
