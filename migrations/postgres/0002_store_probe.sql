-- One row the persistence writer rewrites while the store is failing, to learn when
-- commits work again.
CREATE TABLE IF NOT EXISTS store_probe (
    id INTEGER PRIMARY KEY,
    at BIGINT NOT NULL
);
