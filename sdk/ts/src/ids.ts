/**
 * Ids: the conversation id formats and fresh client_msg_ids.
 * @module
 */

/**
 * Conversation id of a one-to-one chat: `u:<a>:<b>` with the two user ids sorted.
 * @param a - one user. @param b - the other.
 */
export function directConversationId(a: string, b: string): string {
  return a <= b ? `u:${a}:${b}` : `u:${b}:${a}`;
}

/** Conversation id of a group: `g:<groupId>`. @param groupId - the group. */
export function groupConversationId(groupId: string): string {
  return `g:${groupId}`;
}

/** A fresh client_msg_id (a random UUID v4). */
export function newClientMsgId(): string {
  return globalThis.crypto.randomUUID();
}
