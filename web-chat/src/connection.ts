/**
 * One signed-in session's SDK client: made to follow the browser's network state (the
 * SDK's `watchNetwork`: `offline` closes the socket, `online` reconnects) with an
 * IndexedDB outbox, its events turned into state actions (messages, stored sends, acks,
 * receipts, typing, presence, connection status), and the conversation list refreshed
 * after each sync. User intents that call the client live in actions.ts.
 */
import {
  Client,
  IndexedDbOutboxStore,
  MemoryOutboxStore,
  directConversationId,
  groupConversationId,
  type ImError,
  type OutboxEntry,
  type OutboxStore,
} from "im-sdk";
import { incoming, summary } from "./convert.js";
import type { Store } from "./state.js";

/** Conversations fetched per ListConversations page, and pages read at most. */
const LIST_PAGE = 50;
const LIST_PAGES = 4;
/** Reconnect delays are kept short: a chat should come back soon after the network. */
const RECONNECT_MAX_MS = 3000;

/** The outbox of `me`, and whether it outlives the tab (IndexedDB, not memory). */
function outboxStore(me: string): { outbox: OutboxStore; durable: boolean } {
  if (typeof indexedDB === "undefined") return { outbox: new MemoryOutboxStore(), durable: false };
  return { outbox: new IndexedDbOutboxStore(`im-outbox-${me}`), durable: true };
}

/** A signed-in session: the client and how to end it. */
export class Connection {
  /** The SDK client. */
  readonly client: Client;
  private presenceFor = "";
  private everConnected = false;
  private closing = false;
  private listing: Promise<void> | null = null;
  private listAgain = false;

  /**
   * Shows what a previous run left in the outbox as pending, then makes the client
   * for `me` at `serverUrl` and starts connecting (the SDK resends the outbox).
   */
  static async start(
    store: Store,
    me: string,
    serverUrl: string,
    token: string,
    onEnded: (why: string) => void,
  ): Promise<Connection> {
    const { outbox, durable } = outboxStore(me);
    await showOutbox(store, me, outbox, durable);
    return new Connection(store, me, serverUrl, token, outbox, durable, onEnded);
  }

  private constructor(
    private readonly store: Store,
    readonly me: string,
    private readonly serverUrl: string,
    token: string,
    outbox: OutboxStore,
    private readonly durable: boolean,
    private readonly onEnded: (why: string) => void,
  ) {
    this.client = new Client({
      url: serverUrl,
      token,
      routeUrl: null,
      outboxStore: outbox,
      reconnectMaxMs: RECONNECT_MAX_MS,
      // Browsers can report the network gone while an open WebSocket lingers (DevTools'
      // offline emulation does not touch it): the SDK closes it at `offline`, holds
      // reconnects while offline, and reconnects at `online`.
      watchNetwork: true,
    });
    this.listen();
    this.client.connect().catch((e: unknown) => this.ended(e));
  }

  /** Ends the session (unsent messages stay in the outbox for the next sign-in). */
  async close(): Promise<void> {
    this.closing = true;
    await this.client.close();
  }

  private listen(): void {
    const c = this.client;
    // Once closing, this session's events no longer touch the state (a new one may own it).
    const d = (a: Parameters<Store["dispatch"]>[0]): void => {
      if (!this.closing) this.store.dispatch(a);
    };
    c.on("connected", () => {
      if (!this.everConnected) d({ type: "notice", text: "" });
      this.everConnected = true;
      d({ type: "status", status: "online" });
      this.presenceFor = "";
      this.refreshList();
    });
    c.on("disconnected", (e) => {
      if (this.everConnected) return d({ type: "status", status: "offline" });
      // Not connected yet: say why, while the SDK keeps trying.
      const why = e.reason || (navigator.onLine ? `connection closed (${e.code})` : "network offline");
      d({ type: "notice", text: `Cannot connect to ${this.serverUrl} yet: ${why}` });
    });
    c.on("message", (m) => {
      const msg = incoming(m);
      if (msg) d({ type: "messages", list: [msg] });
      void this.watchPresence();
    });
    c.on("acked", (a) => {
      d({ type: "acked", conversationId: a.conversationId, clientMsgId: a.clientMsgId, seq: a.seq, time: a.serverTime });
      void this.watchPresence();
    });
    // Stored in IndexedDB: the message survives a closed tab from now on ("saved").
    if (this.durable) c.on("queued", (q) => d({ type: "stored", clientMsgId: q.clientMsgId }));
    c.on("sendFailed", (f) => d({ type: "send-failed", clientMsgId: f.clientMsgId, reason: f.error.message }));
    c.on("receipt", (r) => d({ type: "receipt", conversationId: r.conversationId, userId: r.userId, seq: r.seq }));
    c.on("typing", (t) =>
      d({ type: "typing", conversationId: t.conversationId, userId: t.userId, typing: t.typing, now: Date.now() }),
    );
    c.on("presence", (p) => d({ type: "presence", userId: p.userId, online: p.online }));
    c.on("synced", () => this.refreshList());
    c.on("closed", (e) => {
      if (e.error) this.ended(e.error);
    });
  }

  /** The client stopped for good (login refused, token expired, kicked...). */
  private ended(e: unknown): void {
    if (this.closing) return;
    this.closing = true;
    this.onEnded(e instanceof Error ? e.message : String(e));
  }

  /** Reads the conversation list again (once more after the read under way, if any). */
  refreshList(): void {
    if (this.listing) {
      this.listAgain = true;
      return;
    }
    this.listing = this.readList().finally(() => {
      this.listing = null;
      if (this.listAgain) {
        this.listAgain = false;
        this.refreshList();
      }
    });
  }

  /** Reads the conversation list (a few pages) into the state. */
  private async readList(): Promise<void> {
    try {
      let after = "";
      for (let i = 0; i < LIST_PAGES && !this.closing; i++) {
        const page = await this.client.listConversations({ after, limit: LIST_PAGE });
        if (this.closing) return;
        this.store.dispatch({ type: "summaries", list: page.conversations.map(summary) });
        after = page.nextAfter;
        if (!after) break;
      }
      await this.watchPresence();
    } catch (e) {
      this.notice("Could not load the conversation list", e);
    }
  }

  /** Subscribes to the presence of every direct peer with messages (when that set changed). */
  async watchPresence(): Promise<void> {
    const peers = [...this.store.state.conversations.values()]
      // The server watches only users one shares a conversation with (a message sent).
      .filter((c) => c.kind === "direct" && c.lastSeq > 0)
      .map((c) => c.name)
      .sort()
      .slice(0, 100);
    const key = peers.join("\n");
    if (key === this.presenceFor || this.client.state !== "connected") return;
    this.presenceFor = key;
    try {
      await this.client.subscribePresence(peers);
    } catch (e) {
      this.presenceFor = "";
      this.notice("Could not watch presence", e);
    }
  }

  /** Shows a problem without ending the session. */
  notice(what: string, e: unknown): void {
    if (this.closing) return;
    const err = e as Partial<ImError>;
    this.store.dispatch({ type: "notice", text: `${what}: ${err.message ?? String(e)}` });
  }
}

/** Shows what a previous run left unsent: "saved" when the outbox outlives the tab. */
async function showOutbox(store: Store, me: string, outbox: OutboxStore, durable: boolean): Promise<void> {
  let entries: OutboxEntry[];
  try {
    entries = await outbox.load();
  } catch {
    return; // No readable outbox: nothing to show; the SDK reports its own failure.
  }
  for (const e of entries) {
    if (e.op !== "send") continue;
    const conversationId = "to" in e.target ? directConversationId(me, e.target.to) : groupConversationId(e.target.group);
    const text = new TextDecoder().decode(e.payload);
    const time = e.createdAt;
    store.dispatch({ type: "queued", conversationId, clientMsgId: e.clientMsgId, text, time, stored: durable });
  }
}
