/**
 * `Client`: the app's handle. Owns the public API: argument checks (typed errors before
 * anything is sent), the typed events, and thin wrappers of each protocol operation over
 * the engine's request path; the connection state machine, outbox, sync and ordering
 * live in `engine.ts` and the modules it wires.
 * @module
 */

import { Emitter } from "./emitter.js";
import { Engine } from "./engine.js";
import { ClientClosedError, ConfigError, InvalidArgumentError, ProtocolError } from "./errors.js";
import type { ClientEvents, ConnectionState } from "./events.js";
import { toGroupInfo, toMessage, toSummary, type pb } from "./convert.js";
import { newClientMsgId } from "./ids.js";
import type { ClientOptions, ResolvedOptions, WebSocketConstructor } from "./options.js";
import { browserNetwork } from "./network.js";
import { routeBaseOf } from "./route.js";
import type { OutboxEntry } from "./store.js";
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
import {
  checkConversation,
  checkHttpUrl,
  checkId,
  checkIds,
  checkPayload,
  checkSeq,
  checkTarget,
  checkWsUrl,
} from "./validate.js";
import { create } from "@bufbuild/protobuf";
import { pb as gen } from "./convert.js";
import { FrameOut } from "./wire.js";
import { TypingThrottle } from "./typing.js";

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

/** Fills in the defaults and checks the options. @param o - the app's options. */
export function resolveOptions(o: ClientOptions): ResolvedOptions {
  if (typeof o !== "object" || o === null) throw new InvalidArgumentError("options", "must be an object");
  const url = checkWsUrl(o.url);
  if (o.token === undefined && o.getToken === undefined) {
    throw new InvalidArgumentError("token", "give a token or a getToken provider");
  }
  if (o.token !== undefined && (typeof o.token !== "string" || o.token.length === 0)) {
    throw new InvalidArgumentError("token", "must be a non-empty string");
  }
  if (o.deviceId !== undefined && o.deviceId !== "") checkId("deviceId", o.deviceId);
  const routeUrl = o.routeUrl === null ? undefined : o.routeUrl === undefined ? routeBaseOf(url) : checkHttpUrl(o.routeUrl).href;
  const ws = o.webSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
  if (typeof ws !== "function") {
    throw new ConfigError("no WebSocket implementation: pass options.webSocket (in Node 20: WebSocket from the ws package)");
  }
  const positive = (name: string, v: number | undefined, dflt: number): number => {
    if (v === undefined) return dflt;
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) throw new InvalidArgumentError(name, "must be a positive number");
    return v;
  };
  return {
    url: url.href,
    token: o.token,
    getToken: o.getToken,
    deviceId: o.deviceId ?? "",
    routeUrl,
    webSocket: ws,
    reconnectMinMs: positive("reconnectMinMs", o.reconnectMinMs, 500),
    reconnectMaxMs: positive("reconnectMaxMs", o.reconnectMaxMs, 30_000),
    requestTimeoutMs: positive("requestTimeoutMs", o.requestTimeoutMs, 15_000),
    connectTimeoutMs: positive("connectTimeoutMs", o.connectTimeoutMs, 10_000),
    outboxMax: positive("outboxMax", o.outboxMax, 1000),
    outboxStore: o.outboxStore,
    ackDelayMs: positive("ackDelayMs", o.ackDelayMs, 100),
    maxPayloadBytes: positive("maxPayloadBytes", o.maxPayloadBytes, 60 * 1024),
    typingIntervalMs: positive("typingIntervalMs", o.typingIntervalMs, 3000),
    heartbeatMs: o.heartbeatMs === undefined ? undefined : positive("heartbeatMs", o.heartbeatMs, 30_000),
    refreshBeforeExpMs: o.refreshBeforeExpMs === undefined ? undefined : positive("refreshBeforeExpMs", o.refreshBeforeExpMs, 60_000),
    watchNetwork: o.watchNetwork ?? browserNetwork() !== undefined,
  };
}

/** An im-server client: see the package README for a quick start. */
export class Client extends Emitter<ClientEvents> {
  private readonly opts: ResolvedOptions;
  private readonly engine: Engine;
  private readonly typingThrottle: TypingThrottle;

  /**
   * Makes a client; nothing connects until {@link Client.connect}.
   * @param options - see {@link ClientOptions}; invalid ones throw {@link InvalidArgumentError} or {@link ConfigError}.
   */
  constructor(options: ClientOptions) {
    super();
    this.opts = resolveOptions(options);
    this.engine = new Engine(this.opts, (e, p) => this.emit(e, p));
    this.typingThrottle = new TypingThrottle(this.opts.typingIntervalMs);
  }

  /** The connection state. */
  get state(): ConnectionState {
    return this.engine.state;
  }

  /** The current session (undefined until the first login). */
  get session(): Session | undefined {
    return this.engine.session;
  }

  /** Unacknowledged outbox entries. */
  get pendingSends(): number {
    return this.engine.outbox.size;
  }

  /**
   * Starts the client: connects, logs in, syncs, resends the outbox, and reconnects
   * after losses until {@link Client.close}. Resolves at the first login; rejects when
   * the client closes before it (login refused, kicked, closed).
   */
  connect(): Promise<Session> {
    return this.engine.start();
  }

  /**
   * Stops for good: sends the DeliverAcks due (waiting up to a second for the server to
   * take them), closes the socket, fails waiting requests. Outbox entries stay in the
   * outbox store for the next run.
   */
  async close(): Promise<void> {
    await this.engine.drain(1000);
    this.engine.terminate();
  }

  private enqueue(entry: OutboxEntry): Promise<SendAck> {
    if (this.engine.state === "closed") return Promise.reject(new ClientClosedError("the client is closed"));
    const acked = this.engine.outbox.add(entry);
    this.engine.outbox.store.put(entry).then(
      () => {
        this.emit("queued", { clientMsgId: entry.clientMsgId });
        this.engine.pump();
      },
      (e: unknown) => {
        this.emit("error", new ProtocolError(`outbox store put failed: ${String(e)}`));
        this.engine.pump();
      },
    );
    return acked;
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
    try {
      const t = checkTarget(target);
      const type = options?.type ?? "TEXT";
      if (!["TEXT", "IMAGE", "FILE"].includes(type)) {
        throw new InvalidArgumentError("type", `clients send TEXT, IMAGE or FILE, not ${String(type)}`);
      }
      const bytes = checkPayload(payload, this.opts.maxPayloadBytes);
      const clientMsgId = checkClientMsgId(options?.clientMsgId);
      return this.enqueue({ op: "send", clientMsgId, target: t, type, payload: bytes, createdAt: Date.now() });
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * Recalls a message (through the outbox; answered with the RECALL event's ack).
   * @param conversationId - its conversation.
   * @param seq - its seq.
   * @param msgId - its id.
   */
  recall(conversationId: string, seq: number, msgId: string): Promise<SendAck> {
    return this.guard(() => this.enqueue({ op: "recall", ...messageRef(conversationId, seq, msgId) }));
  }

  /**
   * Replaces a message's payload (its sender only; through the outbox).
   * @param conversationId - its conversation.
   * @param seq - its seq.
   * @param msgId - its id.
   * @param payload - the new text or bytes.
   */
  edit(conversationId: string, seq: number, msgId: string, payload: string | Uint8Array): Promise<SendAck> {
    return this.guard(() =>
      this.enqueue({
        op: "edit",
        ...messageRef(conversationId, seq, msgId),
        payload: checkPayload(payload, this.opts.maxPayloadBytes),
      }),
    );
  }

  /** Runs `f` turning a synchronous argument error into a rejection. */
  private guard<T>(f: () => Promise<T>): Promise<T> {
    try {
      return f();
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * Hides a message for the caller only (all their devices).
   * @param conversationId - its conversation.
   * @param seq - its seq.
   */
  deleteForMe(conversationId: string, seq: number): Promise<void> {
    return this.guard(async () => {
      const value = create(gen.DeleteForMeSchema, { conversationId: checkConversation(conversationId), seq: BigInt(checkSeq("seq", seq)) });
      await this.engine.request({ case: "deleteForMe", value }, "done");
    });
  }

  /**
   * Any group operation; the convenience methods below call it.
   * @param req - the operation.
   */
  groupOp(req: GroupOpRequest): Promise<GroupInfo> {
    return this.guard(async () => {
      const groupId = req.op === "CREATE" && !req.groupId ? "" : checkId("groupId", req.groupId);
      const value = FrameOut.groupOp({
        op: req.op,
        groupId,
        members: checkIds("members", req.members ?? []),
        kind: req.kind ?? "PRIVATE",
        role: req.role ?? "NONE",
        membersCanInvite: req.membersCanInvite ?? false,
      });
      return toGroupInfo(await this.engine.request({ case: "groupOp", value }, "groupOpOk"));
    });
  }

  /** Creates a group; the caller becomes its owner. @param options - id, members, kind. */
  createGroup(options: CreateGroupOptions = {}): Promise<GroupInfo> {
    const req: GroupOpRequest = { op: "CREATE", groupId: options.groupId ?? "", members: options.members ?? [] };
    if (options.kind !== undefined) req.kind = options.kind;
    if (options.membersCanInvite !== undefined) req.membersCanInvite = options.membersCanInvite;
    return this.groupOp(req);
  }

  /** Joins a public group. @param groupId - the group. */
  joinGroup(groupId: string): Promise<GroupInfo> {
    return this.groupOp({ op: "JOIN", groupId });
  }

  /** Leaves a group. @param groupId - the group. */
  leaveGroup(groupId: string): Promise<GroupInfo> {
    return this.groupOp({ op: "LEAVE", groupId });
  }

  /** Adds members. @param groupId - the group. @param users - who to add. */
  addMembers(groupId: string, users: string[]): Promise<GroupInfo> {
    return this.guard(() => this.groupOp({ op: "ADD", groupId, members: nonEmpty(users) }));
  }

  /** Removes members. @param groupId - the group. @param users - who to remove. */
  removeMembers(groupId: string, users: string[]): Promise<GroupInfo> {
    return this.guard(() => this.groupOp({ op: "REMOVE", groupId, members: nonEmpty(users) }));
  }

  /** Removes and bans users. @param groupId - the group. @param users - who to ban. */
  banMembers(groupId: string, users: string[]): Promise<GroupInfo> {
    return this.guard(() => this.groupOp({ op: "BAN", groupId, members: nonEmpty(users) }));
  }

  /** Lifts bans. @param groupId - the group. @param users - who to unban. */
  unbanMembers(groupId: string, users: string[]): Promise<GroupInfo> {
    return this.guard(() => this.groupOp({ op: "UNBAN", groupId, members: nonEmpty(users) }));
  }

  /**
   * Gives users a role (MEMBER or ADMIN).
   * @param groupId - the group. @param users - whose role. @param role - the role.
   */
  setRole(groupId: string, users: string[], role: "MEMBER" | "ADMIN"): Promise<GroupInfo> {
    if (role !== "MEMBER" && role !== "ADMIN") {
      return Promise.reject(new InvalidArgumentError("role", `must be MEMBER or ADMIN, not ${String(role)}`));
    }
    return this.guard(() => this.groupOp({ op: "SET_ROLE", groupId, members: nonEmpty(users), role }));
  }

  /** Makes `user` the owner (the caller becomes an admin). @param groupId - the group. @param user - the new owner. */
  transferOwnership(groupId: string, user: string): Promise<GroupInfo> {
    return this.groupOp({ op: "TRANSFER", groupId, members: [user] });
  }

  /** Dissolves the group (owner only). @param groupId - the group. */
  dissolveGroup(groupId: string): Promise<GroupInfo> {
    return this.groupOp({ op: "DISSOLVE", groupId });
  }

  /** Reads the group's state. @param groupId - the group. */
  groupInfo(groupId: string): Promise<GroupInfo> {
    return this.groupOp({ op: "INFO", groupId });
  }

  /**
   * Marks a conversation read up to `seq` (forward only); others get a ReadReceipt.
   * @param conversationId - the conversation. @param seq - read up to here.
   */
  markRead(conversationId: string, seq: number): Promise<void> {
    return this.guard(async () => {
      const value = create(gen.MarkReadSchema, { conversationId: checkConversation(conversationId), seq: BigInt(checkSeq("seq", seq)) });
      await this.engine.request({ case: "markRead", value }, "done");
    });
  }

  /**
   * A page of the caller's conversations, most recent first.
   * @param options - `after` (the previous page's nextAfter) and `limit` (0: 50).
   */
  listConversations(options: { after?: string; limit?: number } = {}): Promise<ConversationPage> {
    return this.guard(async () => {
      const after = options.after ?? "";
      if (typeof after !== "string") throw new InvalidArgumentError("after", "must be a string");
      const limit = checkSeq("limit", options.limit ?? 0, 0);
      const value = create(gen.ListConversationsSchema, { after, limit });
      const page = await this.engine.request({ case: "listConversations", value }, "conversationList");
      return { conversations: page.conversations.map(toSummary), nextAfter: page.nextAfter };
    });
  }

  /**
   * Sets mute and pin on a conversation.
   * @param conversationId - the conversation. @param flags - muted, pinned.
   */
  setConversationFlags(conversationId: string, flags: { muted: boolean; pinned: boolean }): Promise<void> {
    return this.guard(async () => {
      const value = create(gen.SetConversationFlagsSchema, {
        conversationId: checkConversation(conversationId),
        muted: flags.muted === true,
        pinned: flags.pinned === true,
      });
      await this.engine.request({ case: "setConversationFlags", value }, "done");
    });
  }

  /**
   * A page of history before `beforeSeq` (0: from the end), newest first.
   * @param conversationId - the conversation. @param options - beforeSeq, limit.
   */
  fetchHistory(conversationId: string, options: { beforeSeq?: number; limit?: number } = {}): Promise<HistoryPage> {
    return this.guard(async () => {
      const value = create(gen.FetchHistorySchema, {
        conversationId: checkConversation(conversationId),
        beforeSeq: BigInt(checkSeq("beforeSeq", options.beforeSeq ?? 0, 0)),
        limit: checkSeq("limit", options.limit ?? 0, 0),
      });
      const page = await this.engine.request({ case: "fetchHistory", value }, "historyPage");
      return { messages: page.messages.map((m: pb.ChatMessage) => toMessage(m)), more: page.more };
    });
  }

  /**
   * Watches the presence of these users (replaces the previous set; empty: none); kept
   * across reconnects. Presence events follow.
   * @param users - user ids.
   */
  subscribePresence(users: string[]): Promise<void> {
    return this.guard(async () => {
      const list = [...checkIds("users", users)];
      this.engine.presenceWatch = list;
      await this.engine.request({ case: "presenceSubscribe", value: FrameOut.presenceSubscribe(list) }, "done");
    });
  }

  /** Hides (or shows again) the caller's presence. @param hidden - hide. */
  setPresenceHidden(hidden: boolean): Promise<void> {
    return this.guard(async () => {
      if (typeof hidden !== "boolean") throw new InvalidArgumentError("hidden", "must be a boolean");
      this.engine.presenceHidden = hidden;
      await this.engine.request({ case: "setPresence", value: FrameOut.setPresence(hidden) }, "done");
    });
  }

  /**
   * Says the user is typing (or stopped). Throttled to the server's pace: a `true` is
   * sent at most every `typingIntervalMs` per conversation, a stop at once (only after a
   * `true`); frames over the server's default typing rate (2/s, burst 10) are dropped
   * here (typing is ephemeral). Resolves true when a frame went out, false when the
   * throttle (or a missing connection) dropped it.
   * @param conversationId - the conversation. @param typing - typing or stopped.
   */
  typing(conversationId: string, typing: boolean): Promise<boolean> {
    return this.guard(async () => {
      const conv = checkConversation(conversationId);
      if (!this.typingThrottle.allow(conv, typing === true, Date.now())) return false;
      const value = create(gen.TypingSchema, { conversationId: conv, typing: typing === true });
      return this.engine.fire({ case: "typing", value });
    });
  }

  /** Syncs now (normally automatic: after connects, gaps and hints). */
  sync(): Promise<void> {
    if (this.engine.state === "closed") return Promise.reject(new ClientClosedError("the client is closed"));
    return this.engine.sync.request();
  }

  /** Round trip to the server. */
  async ping(): Promise<Pong> {
    const p = await this.engine.request({ case: "ping", value: FrameOut.ping(Date.now()) }, "pong");
    return { clientTime: Number(p.clientTime), serverTime: Number(p.serverTime) };
  }
}

function nonEmpty(users: string[]): string[] {
  if (!Array.isArray(users) || users.length === 0) throw new InvalidArgumentError("users", "name at least one user");
  return users;
}

function checkClientMsgId(id: unknown): string {
  if (id === undefined) return newClientMsgId();
  if (typeof id !== "string" || id.length === 0 || id.length > 128) {
    throw new InvalidArgumentError("clientMsgId", "must be a non-empty string of at most 128 characters");
  }
  return id;
}

/** The checked reference to a message that a recall or edit names, with a fresh client_msg_id. */
function messageRef(conversationId: string, seq: number, msgId: string) {
  return {
    clientMsgId: newClientMsgId(),
    conversationId: checkConversation(conversationId),
    seq: checkSeq("seq", seq),
    msgId: checkMsgId(msgId),
    createdAt: Date.now(),
  };
}

function checkMsgId(id: unknown): string {
  if (typeof id !== "string" || id.length === 0 || id.length > 128) {
    throw new InvalidArgumentError("msgId", "must be the message's non-empty msg_id");
  }
  return id;
}
