-- Multi-region replication of cursors (server/src/store/repl_cursors.rs). One row per
-- (user, device, conversation, kind) whose cursor this region moved and has not yet
-- published: kind 0 the delivered cursor (DeliverAck), 1 the read cursor (MarkRead),
-- `seq` the furthest move, `at` when (ms). Written in the transaction that moves the
-- cursor, so several moves of one key before the publisher's next round are one row;
-- the publisher deletes a row once JetStream acked a seq at least as far.
CREATE TABLE region_cursor_outbox (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    kind INTEGER NOT NULL,
    seq BIGINT NOT NULL,
    at BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, conversation_id, kind)
);
