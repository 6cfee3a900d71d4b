/**
 * The app's state and the one function that changes it. Everything the screen shows is
 * here: the connection, the conversation list, each conversation's loaded messages
 * (sent, pending and received), read receipts, typing and presence. Events from the SDK
 * and the user's actions become {@link Action}s; {@link reduce} applies them; the view
 * renders the result. No DOM, no SDK calls: this module is tested in Node.
 */

/** The connection as the app shows it. */
export type ConnStatus = "signed-out" | "connecting" | "online" | "offline";

/** One message on screen: a stored one (seq > 0) or one of ours still in the outbox. */
export interface ChatMsg {
  /** Stable key: the client_msg_id when there is one, else `seq:<seq>`. */
  key: string;
  /** Position in the conversation; 0 while unacknowledged. */
  seq: number;
  sender: string;
  text: string;
  /** ms since the epoch. */
  time: number;
  /** Ours and not acknowledged yet ("sending…"). */
  pending: boolean;
  /** Pending and kept in the device's outbox, so it survives a closed tab ("saved"). */
  stored?: boolean;
  /** Ours and refused for good: why. */
  failed?: string;
}

/** A conversation summary as the state takes it (from ListConversations). */
export interface SummaryIn {
  id: string;
  kind: "direct" | "group";
  /** Direct: the other party. Group: the group id. */
  name: string;
  unread: number;
  lastSeq: number;
  lastText: string;
  lastTime: number;
  /** Highest seq the other party (any other member) has read. */
  peerReadSeq: number;
}

/** One conversation: its summary and the messages loaded so far. */
export interface Conversation extends SummaryIn {
  /** Loaded messages: stored ones by seq, then pending ones in send order. */
  messages: ChatMsg[];
  /** Older messages exist before the first loaded one (unknown: true until a page says). */
  hasOlder: boolean;
  loadingOlder: boolean;
  /** The newest page has been fetched once. */
  opened: boolean;
  /** Who is typing, until when (ms). */
  typing: { user: string; until: number } | null;
}

/** The whole app state. */
export interface State {
  status: ConnStatus;
  me: string;
  serverUrl: string;
  /** A problem to show (sign-in refused, send failed...), or "". */
  notice: string;
  conversations: Map<string, Conversation>;
  selected: string | null;
  /** Users seen online (presence). */
  online: Set<string>;
}

/** A stored message as the state takes it (from a push, a sync or a history page). */
export interface IncomingMsg {
  conversationId: string;
  seq: number;
  sender: string;
  text: string;
  time: number;
  clientMsgId: string;
}

/** Everything that changes the state. */
export type Action =
  | { type: "signing-in"; serverUrl: string; me: string }
  | { type: "signed-out"; notice: string }
  | { type: "status"; status: ConnStatus }
  | { type: "notice"; text: string }
  | { type: "summaries"; list: SummaryIn[] }
  | { type: "open-direct"; conversationId: string; peer: string }
  | { type: "select"; conversationId: string | null }
  | { type: "messages"; list: IncomingMsg[] }
  | { type: "history-loading"; conversationId: string }
  | { type: "history"; conversationId: string; list: IncomingMsg[]; more: boolean }
  | { type: "history-failed"; conversationId: string; notice: string }
  | { type: "queued"; conversationId: string; clientMsgId: string; text: string; time: number; stored?: boolean }
  | { type: "stored"; clientMsgId: string }
  | { type: "acked"; conversationId: string; clientMsgId: string; seq: number; time: number }
  | { type: "send-failed"; clientMsgId: string; reason: string }
  | { type: "read"; conversationId: string; seq: number }
  | { type: "receipt"; conversationId: string; userId: string; seq: number }
  | { type: "typing"; conversationId: string; userId: string; typing: boolean; now: number }
  | { type: "presence"; userId: string; online: boolean };

/** How long a typing signal shows without a refresh, ms. */
export const TYPING_SHOW_MS = 6000;

/** A fresh signed-out state. */
export function initialState(): State {
  return {
    status: "signed-out",
    me: "",
    serverUrl: "",
    notice: "",
    conversations: new Map(),
    selected: null,
    online: new Set(),
  };
}

/** The other party of a direct conversation id `u:<a>:<b>`, or null. */
export function peerOf(conversationId: string, me: string): string | null {
  if (!conversationId.startsWith("u:")) return null;
  const rest = conversationId.slice(2);
  // User ids may not contain ':' on either side of the pair the server builds.
  const i = rest.indexOf(":");
  if (i < 0) return null;
  const a = rest.slice(0, i);
  const b = rest.slice(i + 1);
  return a === me ? b : a;
}

function newConversation(id: string, me: string): Conversation {
  const peer = peerOf(id, me);
  return {
    id,
    kind: peer === null ? "group" : "direct",
    name: peer ?? (id.startsWith("g:") ? id.slice(2) : id),
    unread: 0,
    lastSeq: 0,
    lastText: "",
    lastTime: 0,
    peerReadSeq: 0,
    messages: [],
    hasOlder: true,
    loadingOlder: false,
    opened: false,
    typing: null,
  };
}

function conversation(s: State, id: string): Conversation {
  let c = s.conversations.get(id);
  if (!c) {
    c = newConversation(id, s.me);
    s.conversations.set(id, c);
  }
  return c;
}

/** Inserts a stored message once (by seq), replacing our pending copy with the same id. */
function insertStored(c: Conversation, m: IncomingMsg): boolean {
  const msgs = c.messages;
  if (msgs.some((x) => x.seq === m.seq)) return false;
  const own = m.clientMsgId ? msgs.findIndex((x) => x.key === m.clientMsgId) : -1;
  if (own >= 0) msgs.splice(own, 1);
  const stored: ChatMsg = {
    key: m.clientMsgId || `seq:${m.seq}`,
    seq: m.seq,
    sender: m.sender,
    text: m.text,
    time: m.time,
    pending: false,
  };
  // Stored ones stay sorted by seq, ahead of the pending ones.
  let at = msgs.findIndex((x) => x.seq === 0 || x.seq > m.seq);
  if (at < 0) at = msgs.length;
  msgs.splice(at, 0, stored);
  return true;
}

function touchLast(c: Conversation, seq: number, text: string, time: number): void {
  if (seq >= c.lastSeq) {
    c.lastSeq = seq;
    c.lastText = text;
    c.lastTime = time;
  }
}

function applyMessages(s: State, list: IncomingMsg[]): void {
  for (const m of list) {
    const c = conversation(s, m.conversationId);
    const known = c.lastSeq;
    // Counted unread only past the last seq the list reported (which counted those).
    // The server counts a user's own message as read by them (their read cursor moves to
    // it, with no receipt), so a message from the other side says they read up to it.
    if (m.sender !== s.me && m.sender !== "") c.peerReadSeq = Math.max(c.peerReadSeq, m.seq);
    if (c.typing?.user === m.sender) c.typing = null; // their message is what they typed
    if (insertStored(c, m) && m.seq > known) {
      touchLast(c, m.seq, m.text, m.time);
      if (m.sender !== s.me && s.selected !== c.id) c.unread += 1;
    }
  }
}

function applySummaries(s: State, list: SummaryIn[]): void {
  for (const x of list) {
    const c = conversation(s, x.id);
    c.kind = x.kind;
    c.name = x.name;
    c.unread = s.selected === x.id ? 0 : x.unread;
    c.peerReadSeq = Math.max(c.peerReadSeq, x.peerReadSeq);
    touchLast(c, x.lastSeq, x.lastText, x.lastTime);
  }
}

function applyHistory(s: State, id: string, list: IncomingMsg[], more: boolean): void {
  const c = conversation(s, id);
  c.opened = true;
  c.loadingOlder = false;
  c.hasOlder = more;
  for (const m of list) {
    insertStored(c, m);
    touchLast(c, m.seq, m.text, m.time);
  }
}

function applyAck(s: State, a: Extract<Action, { type: "acked" }>): void {
  const c = conversation(s, a.conversationId);
  const i = c.messages.findIndex((x) => x.key === a.clientMsgId);
  const pending = c.messages[i];
  // An ack of a message this page never showed: its text comes with the history.
  if (i < 0 || !pending) return;
  c.messages.splice(i, 1);
  const m = { conversationId: a.conversationId, seq: a.seq, sender: s.me, text: pending.text, time: a.time, clientMsgId: a.clientMsgId };
  insertStored(c, m);
  touchLast(c, a.seq, m.text, a.time);
}

function applyQueued(s: State, a: Extract<Action, { type: "queued" }>): void {
  const c = conversation(s, a.conversationId);
  if (c.messages.some((x) => x.key === a.clientMsgId)) return;
  c.messages.push({ key: a.clientMsgId, seq: 0, sender: s.me, text: a.text, time: a.time, pending: true, stored: a.stored ?? false });
}

/** Our pending message with this id, in whichever conversation holds it. */
function findPending(s: State, clientMsgId: string): ChatMsg | undefined {
  for (const c of s.conversations.values()) {
    const m = c.messages.find((x) => x.key === clientMsgId && x.pending);
    if (m) return m;
  }
  return undefined;
}

function applySendFailed(s: State, clientMsgId: string, reason: string): void {
  for (const c of s.conversations.values()) {
    const m = c.messages.find((x) => x.key === clientMsgId);
    if (m) {
      m.pending = false;
      m.failed = reason;
    }
  }
  s.notice = `A message was not sent: ${reason}`;
}

function applyTyping(s: State, a: Extract<Action, { type: "typing" }>): void {
  if (a.userId === s.me) return;
  const c = conversation(s, a.conversationId);
  c.typing = a.typing ? { user: a.userId, until: a.now + TYPING_SHOW_MS } : null;
}

/** Applies one action to the state (in place). */
export function reduce(s: State, a: Action): void {
  switch (a.type) {
    case "signing-in":
      Object.assign(s, initialState(), { status: "connecting", serverUrl: a.serverUrl, me: a.me });
      return;
    case "signed-out":
      // The server URL stays, to prefill the next sign-in.
      Object.assign(s, initialState(), { notice: a.notice, serverUrl: s.serverUrl });
      return;
    case "status":
      s.status = a.status;
      if (a.status !== "online") s.online.clear();
      return;
    case "notice":
      s.notice = a.text;
      return;
    case "summaries":
      return applySummaries(s, a.list);
    case "open-direct":
      conversation(s, a.conversationId);
      s.selected = a.conversationId;
      return;
    case "select":
      s.selected = a.conversationId;
      if (a.conversationId) conversation(s, a.conversationId).unread = 0;
      return;
    case "messages":
      return applyMessages(s, a.list);
    case "history-loading":
      conversation(s, a.conversationId).loadingOlder = true;
      return;
    case "history":
      return applyHistory(s, a.conversationId, a.list, a.more);
    case "history-failed":
      conversation(s, a.conversationId).loadingOlder = false;
      s.notice = a.notice;
      return;
    case "queued":
      return applyQueued(s, a);
    case "stored": {
      // Only while pending: an ack may come first when a resend beat the store's write.
      const m = findPending(s, a.clientMsgId);
      if (m) m.stored = true;
      return;
    }
    case "acked":
      return applyAck(s, a);
    case "send-failed":
      return applySendFailed(s, a.clientMsgId, a.reason);
    case "read":
      conversation(s, a.conversationId).unread = 0;
      return;
    case "receipt":
      if (a.userId !== s.me) {
        const c = conversation(s, a.conversationId);
        c.peerReadSeq = Math.max(c.peerReadSeq, a.seq);
      }
      return;
    case "typing":
      return applyTyping(s, a);
    case "presence":
      if (a.online) s.online.add(a.userId);
      else s.online.delete(a.userId);
      return;
  }
}

/** Conversations for the list: most recent activity first. */
export function sortedConversations(s: State): Conversation[] {
  return [...s.conversations.values()].sort((a, b) => b.lastTime - a.lastTime || a.id.localeCompare(b.id));
}

/** The seq up to which the selected conversation is shown and may be marked read. */
export function lastStoredSeq(c: Conversation): number {
  let seq = 0;
  for (const m of c.messages) if (m.seq > seq) seq = m.seq;
  return seq;
}

/** The seq of the oldest loaded message (0 when none is loaded). */
export function oldestSeq(c: Conversation): number {
  return c.messages.find((m) => m.seq > 0)?.seq ?? 0;
}

/** Holds the state, applies actions, and tells subscribers after each change. */
export class Store {
  /** The current state (read it; change it only through {@link Store.dispatch}). */
  readonly state: State = initialState();
  private readonly listeners = new Set<(s: State) => void>();

  /** Applies `a` and notifies every subscriber. */
  dispatch(a: Action): void {
    reduce(this.state, a);
    for (const fn of this.listeners) fn(this.state);
  }

  /** Calls `fn` after every change; returns the unsubscribe function. */
  subscribe(fn: (s: State) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }
}
