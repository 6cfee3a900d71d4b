-- RECALL and EDIT events by the message they change: a recall empties the EDIT events
-- of its message too, found through this index (events only, so it stays small).
CREATE INDEX messages_refs ON messages (conversation_id, ref_seq) WHERE ref_seq > 0;
