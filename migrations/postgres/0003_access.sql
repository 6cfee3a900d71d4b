-- Access control: group kinds and roles, membership intervals, bans, per-conversation
-- idempotency, token revocations.

-- kind: 0 private (invitation only), 1 public. version: seq of the last membership
-- change in the group's conversation. dissolved: 1 once the owner dissolved it.
ALTER TABLE chat_groups ADD COLUMN kind INTEGER NOT NULL DEFAULT 0;
ALTER TABLE chat_groups ADD COLUMN members_can_invite INTEGER NOT NULL DEFAULT 0;
ALTER TABLE chat_groups ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE chat_groups ADD COLUMN dissolved INTEGER NOT NULL DEFAULT 0;
-- size: the member count, kept with each change.
ALTER TABLE chat_groups ADD COLUMN size INTEGER NOT NULL DEFAULT 0;
UPDATE chat_groups SET size = (SELECT COUNT(*) FROM group_members m
    WHERE m.group_id = chat_groups.group_id);
CREATE INDEX chat_groups_by_creator ON chat_groups (created_by);

-- role: 1 member, 2 admin, 3 owner. Groups from before roles: their creator owns them.
ALTER TABLE group_members ADD COLUMN role INTEGER NOT NULL DEFAULT 1;
UPDATE group_members SET role = 3 WHERE EXISTS (SELECT 1 FROM chat_groups g
    WHERE g.group_id = group_members.group_id AND g.created_by = group_members.user_id);

-- Every membership interval: the user reads seqs joined_seq..=left_seq (left_seq NULL:
-- still a member). Members from before intervals read from the start (joined_seq 0).
CREATE TABLE group_intervals (
    group_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    joined_seq BIGINT NOT NULL,
    left_seq BIGINT,
    PRIMARY KEY (group_id, user_id, joined_seq)
);
INSERT INTO group_intervals (group_id, user_id, joined_seq, left_seq)
    SELECT group_id, user_id, 0, NULL FROM group_members;

CREATE TABLE group_bans (
    group_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    banned_by TEXT NOT NULL,
    banned_at BIGINT NOT NULL,
    PRIMARY KEY (group_id, user_id)
);

-- Idempotency per conversation: one stored message per (sender, conversation, client_msg_id).
DROP INDEX messages_dedup;
CREATE UNIQUE INDEX messages_dedup_conv ON messages (sender, conversation_id, client_msg_id);

-- Tokens of a user issued at or before revoked_at (unix seconds) are refused.
CREATE TABLE revocations (
    user_id TEXT PRIMARY KEY,
    revoked_at BIGINT NOT NULL
);
