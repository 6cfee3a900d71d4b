-- One row the persistence writer rewrites while the store is failing, to learn when
-- commits work again (a real write: it needs journal space, like a message does).
CREATE TABLE IF NOT EXISTS store_probe (
    id INTEGER PRIMARY KEY,
    at BIGINT NOT NULL
);
