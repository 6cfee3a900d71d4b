-- Moving a conversation's home region (server/src/region_home.rs, docs/multi-region.md).
-- conversation_homes: one row per move of a conversation, by epoch (the hash rule's home
-- is epoch 0 and has no row). `region` is the home from `epoch` on; `fence_seq` the last
-- seq of the epoch before, so records of that epoch above it are fenced off. `id` is the
-- change cursor every node polls to keep its in-memory map current.
CREATE TABLE conversation_homes (
    conversation_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    region TEXT NOT NULL,
    fence_seq BIGINT NOT NULL,
    moved_at BIGINT NOT NULL,
    id BIGSERIAL NOT NULL UNIQUE,
    PRIMARY KEY (conversation_id, epoch)
);
-- region_reconcile: messages a region held above a move's fence, moved out of
-- `messages` when it learnt the move. `record` is the message as a replication record
-- (JSON). `resend` 1: this region committed it as the old home and re-sends it to the
-- new home (status 0 pending, 1 re-sent at `new_seq`); 0: an applied copy the old home
-- re-sends itself, or an event that is not re-sent (status 2, kept for the operator).
CREATE TABLE region_reconcile (
    id BIGSERIAL PRIMARY KEY,
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
CREATE INDEX region_reconcile_pending ON region_reconcile (status, id);
