-- Conversations and their last allocated seq (seq is gapless per conversation).
CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE messages (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    msg_id TEXT NOT NULL,
    sender TEXT NOT NULL,
    client_msg_id TEXT,            -- NULL when the client gave none
    msg_type INTEGER NOT NULL,
    payload BLOB NOT NULL,
    send_time INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
-- Idempotency: one stored message per (sender, client_msg_id).
CREATE UNIQUE INDEX messages_dedup ON messages (sender, client_msg_id);

-- One-to-one conversations each user takes part in (groups come from group_members).
CREATE TABLE user_conversations (
    user_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    PRIMARY KEY (user_id, conversation_id)
) WITHOUT ROWID;

-- Delivered-up-to cursor per user and conversation (DeliverAck, cumulative).
CREATE TABLE cursors (
    user_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (user_id, conversation_id)
) WITHOUT ROWID;

CREATE TABLE chat_groups (
    group_id TEXT PRIMARY KEY,
    created_by TEXT NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE group_members (
    group_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    joined_at INTEGER NOT NULL,
    PRIMARY KEY (group_id, user_id)
) WITHOUT ROWID;
CREATE INDEX group_members_by_user ON group_members (user_id, group_id);
