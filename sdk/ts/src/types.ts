/**
 * The app-facing data types: plain objects with `number` seqs and string enum names,
 * converted from the generated protobuf messages (src/gen) in one place, `convert.ts`.
 * @module
 */

import type { ServerErrorCode } from "./errors.js";

/** Kind of a message (`im.v1.MessageType`). RECALL and EDIT are events naming another message. */
export type MessageType = "TEXT" | "IMAGE" | "FILE" | "SYSTEM" | "RECALL" | "EDIT";

/** A stored message's latest state as sync and history return it (`im.v1.MessageState`). */
export type MessageState = "ORIGINAL" | "EDITED" | "RECALLED" | "HIDDEN";

/** A group operation (`im.v1.GroupOp.Op`). */
export type GroupOpName =
  | "CREATE"
  | "JOIN"
  | "LEAVE"
  | "ADD"
  | "REMOVE"
  | "BAN"
  | "UNBAN"
  | "SET_ROLE"
  | "TRANSFER"
  | "DISSOLVE"
  | "INFO";

/** Who may join a group (`im.v1.GroupOp.Kind`). */
export type GroupKind = "PRIVATE" | "PUBLIC";

/** A member's role (`im.v1.GroupOp.Role`); NONE for a non-member. */
export type GroupRole = "NONE" | "MEMBER" | "ADMIN" | "OWNER";

/** Kind of a conversation. */
export type ConversationKind = "DIRECT" | "GROUP";

/** Where a message goes: one user, or a group. */
export type Target = { readonly to: string } | { readonly group: string };

/** A membership change, decoded from a SYSTEM message's `GroupEvent` payload. */
export interface GroupEvent {
  /** What happened. */
  op: GroupOpName;
  /** Who did it. */
  actor: string;
  /** To whom (at most 256 listed; `count` is the full number). */
  users: string[];
  /** How many users it concerns. */
  count: number;
  /** SET_ROLE: the new role. */
  role: GroupRole;
  /** CREATE: the group's kind. */
  kind: GroupKind;
}

/** A chat message (or RECALL/EDIT/SYSTEM event) as the app receives it. */
export interface Message {
  /** Conversation: `u:<a>:<b>` for one-to-one, `g:<group>` for a group. */
  conversationId: string;
  /** Who sent it (empty for server-written SYSTEM messages). */
  sender: string;
  /** Raw payload bytes. */
  payload: Uint8Array;
  /** The payload decoded as UTF-8 (TEXT, EDIT; empty when it is not text). */
  text: string;
  /** Send time, ms since the epoch. */
  sendTime: number;
  /** Kind of message. */
  type: MessageType;
  /** Position in the conversation (1, 2, ...). */
  seq: number;
  /** Server-assigned id. */
  msgId: string;
  /** The sender's idempotency id. */
  clientMsgId: string;
  /** RECALL and EDIT: the seq of the message they change. */
  refSeq: number;
  /** RECALL and EDIT: the id of the message they change. */
  refMsgId: string;
  /** Sync and history: the message's latest state (pushes carry ORIGINAL). */
  state: MessageState;
  /** EDITED: when the latest edit was made, ms. */
  editTime: number;
  /** SYSTEM messages of a group: the decoded membership change. */
  groupEvent?: GroupEvent;
}

/** The server's acknowledgement of a committed send, recall or edit. */
export interface SendAck {
  /** The idempotency id the SDK sent. */
  clientMsgId: string;
  /** Server-assigned id. */
  msgId: string;
  /** The conversation it went to. */
  conversationId: string;
  /** Its seq there. */
  seq: number;
  /** Commit time, ms. */
  serverTime: number;
  /** The server had it already (a resend after a lost ack): stored once. */
  duplicate: boolean;
}

/** A group's state after an operation, as the caller sees it. */
export interface GroupInfo {
  /** The group id. */
  groupId: string;
  /** Member count. */
  members: number;
  /** Who may join. */
  kind: GroupKind;
  /** The caller's role (NONE after LEAVE or DISSOLVE). */
  role: GroupRole;
  /** Whether plain members may add others. */
  membersCanInvite: boolean;
  /** Seq of the group's last membership change (0: none yet). */
  version: number;
}

/** One entry of the conversation list. */
export interface ConversationSummary {
  /** The conversation id. */
  conversationId: string;
  /** Direct or group. */
  kind: ConversationKind;
  /** Groups: the group id. Direct: the other party. */
  name: string;
  /** Groups: member count. Direct: 2. */
  size: number;
  /** The last message the caller may see (payload cut to a preview). */
  lastMessage?: Message;
  /** The conversation's last seq. */
  lastSeq: number;
  /** When the last message was sent, ms. */
  lastTime: number;
  /** The caller's read cursor. */
  readSeq: number;
  /** Messages after the read cursor not sent by the caller. */
  unread: number;
  /** Muted by the caller. */
  muted: boolean;
  /** Pinned by the caller. */
  pinned: boolean;
  /** Direct: how far the other party has read. */
  peerReadSeq: number;
}

/** A page of the conversation list. */
export interface ConversationPage {
  /** Most recent activity first (pinned ones first). */
  conversations: ConversationSummary[];
  /** Pass as `after` for the next page; empty on the last page. */
  nextAfter: string;
}

/** A page of history, newest first. */
export interface HistoryPage {
  /** Messages, newest first. */
  messages: Message[];
  /** Older visible messages remain. */
  more: boolean;
}

/** Someone read a conversation up to `seq`. */
export interface ReadReceipt {
  /** The conversation. */
  conversationId: string;
  /** The reader (empty in count mode, for large groups). */
  userId: string;
  /** Read up to this seq. */
  seq: number;
  /** Count mode: how many members have read up to seq. */
  readCount: number;
  /** When, ms. */
  readTime: number;
}

/** A user's presence. */
export interface Presence {
  /** The user. */
  userId: string;
  /** Online now. */
  online: boolean;
  /** When they were last online, ms (0: unknown). */
  lastSeen: number;
  /** Connected devices. */
  devices: number;
}

/** Someone is typing (or stopped) in a conversation. */
export interface Typing {
  /** The conversation. */
  conversationId: string;
  /** Typing (true) or stopped (false). */
  typing: boolean;
  /** Who types. */
  userId: string;
}

/** The answer to a Ping. */
export interface Pong {
  /** The client's time echoed, ms. */
  clientTime: number;
  /** The server's time, ms. */
  serverTime: number;
}

/** The session a connection holds (from `LoginOk`). */
export interface Session {
  /** The logged-in user. */
  userId: string;
  /** The server's session id. */
  sessionId: string;
  /** The node serving the connection. */
  nodeId: string;
  /** The server's heartbeat interval, seconds. */
  heartbeatSecs: number;
}

/** A server error code, re-exported for convenience. */
export type { ServerErrorCode };
