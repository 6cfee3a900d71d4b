-- The conversation list: one-to-one conversations carry their last activity per party
-- (kept by each commit), so a page of the most recent ones is an index range, not a
-- sort of all of them; pinned conversations are found through a small partial index.
ALTER TABLE user_conversations ADD COLUMN last_time INTEGER NOT NULL DEFAULT 0;
UPDATE user_conversations SET last_time = COALESCE((SELECT v.last_time FROM conversations v
    WHERE v.conversation_id = user_conversations.conversation_id), 0);
CREATE INDEX user_conversations_recent ON user_conversations (user_id, last_time, conversation_id);
CREATE INDEX conversation_state_pinned ON conversation_state (user_id) WHERE pinned <> 0;
