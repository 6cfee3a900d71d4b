-- Home moves need Postgres (multi-region mode; the config refuses `region` with
-- SQLite); the tables exist here only so both engines keep one schema version.
CREATE TABLE conversation_homes (
    conversation_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    region TEXT NOT NULL,
    fence_seq BIGINT NOT NULL,
    moved_at BIGINT NOT NULL,
    id INTEGER NOT NULL UNIQUE,
    PRIMARY KEY (conversation_id, epoch)
);
CREATE TABLE region_reconcile (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    msg_id TEXT NOT NULL,
    record TEXT NOT NULL,
    resend SMALLINT NOT NULL,
    status SMALLINT NOT NULL DEFAULT 0,
    new_seq BIGINT,
    at BIGINT NOT NULL
);
