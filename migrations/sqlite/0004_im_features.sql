-- The IM features: per-device cursors, read cursors and conversation flags, last
-- activity for the conversation list, recall and edit state, delete-for-me, presence
-- privacy.

-- Per device: delivered up to seq (DeliverAck, cumulative) and read up to seq
-- (MarkRead). Cursors from before devices belong to the default device.
CREATE TABLE device_cursors (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    delivered_seq INTEGER NOT NULL DEFAULT 0,
    read_seq INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, device_id, conversation_id)
) WITHOUT ROWID;
INSERT INTO device_cursors (user_id, device_id, conversation_id, delivered_seq)
    SELECT user_id, 'default', conversation_id, seq FROM cursors;

-- Per user and conversation: the read cursor (the furthest any device marked, and the
-- user's own sends), when it last moved, and the user's flags.
CREATE TABLE conversation_state (
    user_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    read_seq INTEGER NOT NULL DEFAULT 0,
    read_time INTEGER NOT NULL DEFAULT 0,
    muted INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, conversation_id)
) WITHOUT ROWID;
-- Read counts of a conversation's latest messages (large groups).
CREATE INDEX conversation_state_reads ON conversation_state (conversation_id, read_seq);

-- When the conversation's last message was sent, ms (the conversation list's order).
ALTER TABLE conversations ADD COLUMN last_time INTEGER NOT NULL DEFAULT 0;
UPDATE conversations SET last_time = COALESCE((SELECT m.send_time FROM messages m
    WHERE m.conversation_id = conversations.conversation_id
      AND m.seq = conversations.last_seq), 0);

-- RECALL and EDIT events name the message they change (ref_seq, ref_msg_id); the
-- original carries its latest state (0 original, 1 edited, 2 recalled) and, edited,
-- when (its payload is then the edit's).
ALTER TABLE messages ADD COLUMN ref_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN ref_msg_id TEXT;
ALTER TABLE messages ADD COLUMN state INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN edit_time INTEGER NOT NULL DEFAULT 0;

-- Messages a user deleted for themselves (all their devices).
CREATE TABLE hidden_messages (
    user_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (user_id, conversation_id, seq)
) WITHOUT ROWID;

-- Users who hide their presence.
CREATE TABLE presence_settings (
    user_id TEXT PRIMARY KEY,
    hidden INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
