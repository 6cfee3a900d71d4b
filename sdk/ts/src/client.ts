/**
 * `Client`: the app's handle. Owns the connection state machine (connect, login,
 * heartbeat, reconnect with backoff, close-code policy, token refresh), and wires the
 * outbox, the sync engine and the seq tracker to the socket. The protocol operations
 * are thin typed wrappers over one request/response path.
 * @module
 */

import { Emitter } from "./emitter.js";
import type { ClientEvents, ConnectionState } from "./events.js";
import type { ClientOptions } from "./options.js";
import type {
  ConversationPage,
  GroupInfo,
  GroupKind,
  GroupOpName,
  GroupRole,
  HistoryPage,
  MessageType,
  Pong,
  SendAck,
  Session,
  Target,
} from "./types.js";

/** Options of {@link Client.send}. */
export interface SendOptions {
  /** Message kind (default TEXT). SYSTEM is refused (only the server writes it). */
  type?: MessageType;
  /** Idempotency id; default a fresh UUID. Give your own to track the pending message. */
  clientMsgId?: string;
}

/** Options of {@link Client.createGroup}. */
export interface CreateGroupOptions {
  /** Group id; empty or absent: the server names it. */
  groupId?: string;
  /** Initial members besides the caller (who becomes the owner). */
  members?: string[];
  /** Who may join (default PRIVATE). */
  kind?: GroupKind;
  /** Whether plain members may add others. */
  membersCanInvite?: boolean;
}

/** A raw group operation for {@link Client.groupOp}. */
export interface GroupOpRequest {
  /** The operation. */
  op: GroupOpName;
  /** The group (empty for CREATE: the server names it). */
  groupId: string;
  /** Users the operation concerns. */
  members?: string[];
  /** CREATE: the kind. */
  kind?: GroupKind;
  /** SET_ROLE: the role to give. */
  role?: GroupRole;
  /** CREATE: whether plain members may add others. */
  membersCanInvite?: boolean;
}

/** An im-server client: see the package README for a quick start. */
export class Client extends Emitter<ClientEvents> {
  /**
   * Makes a client; nothing connects until {@link Client.connect}.
   * @param options - see {@link ClientOptions}; invalid ones throw {@link ConfigError}.
   */
  constructor(options: ClientOptions) {
    super();
    void options;
  }

  /** The connection state. */
  get state(): ConnectionState {
    return "disconnected";
  }

  /** The current session (undefined until the first login). */
  get session(): Session | undefined {
    return undefined;
  }

  /** Unacknowledged outbox entries. */
  get pendingSends(): number {
    return 0;
  }

  /**
   * Starts the client: connects, logs in, syncs, resends the outbox, and reconnects
   * after losses until {@link Client.close}. Resolves at the first login; rejects when
   * the client closes before it (login refused, kicked, closed).
   */
  connect(): Promise<Session> {
    throw new Error("unfinished");
  }

  /** Stops for good: flushes DeliverAcks, closes the socket, fails waiting requests. */
  close(): Promise<void> {
    throw new Error("unfinished");
  }

  /**
   * Sends a message through the outbox: queued (bounded), resent with the same
   * client_msg_id after reconnects and after RATE_LIMITED/OVERLOADED, resolved with the
   * server's ack once durably committed.
   * @param target - `{to: userId}` or `{group: groupId}`.
   * @param payload - text (UTF-8 encoded) or bytes.
   * @param options - kind and idempotency id.
   */
  send(target: Target, payload: string | Uint8Array, options?: SendOptions): Promise<SendAck> {
    void [target, payload, options];
    throw new Error("unfinished");
  }

  /**
   * Recalls a message (through the outbox; answered with the RECALL event's ack).
   * @param conversationId - its conversation.
   * @param seq - its seq.
   * @param msgId - its id.
   */
  recall(conversationId: string, seq: number, msgId: string): Promise<SendAck> {
    void [conversationId, seq, msgId];
    throw new Error("unfinished");
  }

  /**
   * Replaces a message's payload (its sender only; through the outbox).
   * @param conversationId - its conversation.
   * @param seq - its seq.
   * @param msgId - its id.
   * @param payload - the new text or bytes.
   */
  edit(conversationId: string, seq: number, msgId: string, payload: string | Uint8Array): Promise<SendAck> {
    void [conversationId, seq, msgId, payload];
    throw new Error("unfinished");
  }

  /**
   * Hides a message for the caller only (all their devices).
   * @param conversationId - its conversation.
   * @param seq - its seq.
   */
  deleteForMe(conversationId: string, seq: number): Promise<void> {
    void [conversationId, seq];
    throw new Error("unfinished");
  }

  /**
   * Any group operation; the convenience methods below call it.
   * @param req - the operation.
   */
  groupOp(req: GroupOpRequest): Promise<GroupInfo> {
    void req;
    throw new Error("unfinished");
  }

  /** Creates a group; the caller becomes its owner. @param options - id, members, kind. */
  createGroup(options?: CreateGroupOptions): Promise<GroupInfo> {
    void options;
    throw new Error("unfinished");
  }

  /** Joins a public group. @param groupId - the group. */
  joinGroup(groupId: string): Promise<GroupInfo> {
    void groupId;
    throw new Error("unfinished");
  }

  /** Leaves a group. @param groupId - the group. */
  leaveGroup(groupId: string): Promise<GroupInfo> {
    void groupId;
    throw new Error("unfinished");
  }

  /** Adds members. @param groupId - the group. @param users - who to add. */
  addMembers(groupId: string, users: string[]): Promise<GroupInfo> {
    void [groupId, users];
    throw new Error("unfinished");
  }

  /** Removes members. @param groupId - the group. @param users - who to remove. */
  removeMembers(groupId: string, users: string[]): Promise<GroupInfo> {
    void [groupId, users];
    throw new Error("unfinished");
  }

  /** Removes and bans users. @param groupId - the group. @param users - who to ban. */
  banMembers(groupId: string, users: string[]): Promise<GroupInfo> {
    void [groupId, users];
    throw new Error("unfinished");
  }

  /** Lifts bans. @param groupId - the group. @param users - who to unban. */
  unbanMembers(groupId: string, users: string[]): Promise<GroupInfo> {
    void [groupId, users];
    throw new Error("unfinished");
  }

  /**
   * Gives users a role (MEMBER or ADMIN).
   * @param groupId - the group. @param users - whose role. @param role - the role.
   */
  setRole(groupId: string, users: string[], role: "MEMBER" | "ADMIN"): Promise<GroupInfo> {
    void [groupId, users, role];
    throw new Error("unfinished");
  }

  /** Makes `user` the owner (the caller becomes an admin). @param groupId - the group. @param user - the new owner. */
  transferOwnership(groupId: string, user: string): Promise<GroupInfo> {
    void [groupId, user];
    throw new Error("unfinished");
  }

  /** Dissolves the group (owner only). @param groupId - the group. */
  dissolveGroup(groupId: string): Promise<GroupInfo> {
    void groupId;
    throw new Error("unfinished");
  }

  /** Reads the group's state. @param groupId - the group. */
  groupInfo(groupId: string): Promise<GroupInfo> {
    void groupId;
    throw new Error("unfinished");
  }

  /**
   * Marks a conversation read up to `seq` (forward only); others get a ReadReceipt.
   * @param conversationId - the conversation. @param seq - read up to here.
   */
  markRead(conversationId: string, seq: number): Promise<void> {
    void [conversationId, seq];
    throw new Error("unfinished");
  }

  /**
   * A page of the caller's conversations, most recent first.
   * @param options - `after` (the previous page's nextAfter) and `limit` (0: 50).
   */
  listConversations(options?: { after?: string; limit?: number }): Promise<ConversationPage> {
    void options;
    throw new Error("unfinished");
  }

  /**
   * Sets mute and pin on a conversation.
   * @param conversationId - the conversation. @param flags - muted, pinned.
   */
  setConversationFlags(conversationId: string, flags: { muted: boolean; pinned: boolean }): Promise<void> {
    void [conversationId, flags];
    throw new Error("unfinished");
  }

  /**
   * A page of history before `beforeSeq` (0: from the end), newest first.
   * @param conversationId - the conversation. @param options - beforeSeq, limit.
   */
  fetchHistory(conversationId: string, options?: { beforeSeq?: number; limit?: number }): Promise<HistoryPage> {
    void [conversationId, options];
    throw new Error("unfinished");
  }

  /**
   * Watches the presence of these users (replaces the previous set; empty: none); kept
   * across reconnects. Presence events follow.
   * @param users - user ids.
   */
  subscribePresence(users: string[]): Promise<void> {
    void users;
    throw new Error("unfinished");
  }

  /** Hides (or shows again) the caller's presence. @param hidden - hide. */
  setPresenceHidden(hidden: boolean): Promise<void> {
    void hidden;
    throw new Error("unfinished");
  }

  /**
   * Says the user is typing (or stopped). Throttled to the server's pace: a `true` is
   * sent at most every `typingIntervalMs` per conversation, a stop at once; frames over
   * the server's typing rate are dropped here (typing is ephemeral). Never throws for
   * throttling; resolves when sent (or dropped).
   * @param conversationId - the conversation. @param typing - typing or stopped.
   */
  typing(conversationId: string, typing: boolean): Promise<void> {
    void [conversationId, typing];
    throw new Error("unfinished");
  }

  /** Syncs now (normally automatic: after connects, gaps and hints). */
  sync(): Promise<void> {
    throw new Error("unfinished");
  }

  /** Round trip to the server. */
  ping(): Promise<Pong> {
    throw new Error("unfinished");
  }
}
