-- Multi-region replication (server/src/region_repl.rs). region_outbox: one row per
-- message this region commits as the conversation's home (new messages, SYSTEM, EDIT
-- and RECALL events), written in the commit's own transaction while `region` is set;
-- the publisher drains it in id order into this region's JetStream stream and deletes
-- the rows once JetStream acked them. Messages of conversations homed elsewhere are
-- applied into the ordinary tables, with conversations.last_seq as the applied seq.
CREATE TABLE region_outbox (
    id BIGSERIAL PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    seq BIGINT NOT NULL
);
