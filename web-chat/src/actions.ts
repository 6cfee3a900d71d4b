/**
 * The user's intents carried out: sign in and out, open and select conversations, send
 * (through the SDK's outbox, shown "sending…", then "saved" once stored, until
 * acknowledged), page history backwards, signal typing, and mark what is on screen read.
 */
import { directConversationId, newClientMsgId, type Target } from "im-sdk";
import { Connection } from "./connection.js";
import { incoming } from "./convert.js";
import { checkServerUrl, clearSession, saveSession, SignInError, tokenUser } from "./session.js";
import { type Conversation, type Store, lastStoredSeq, oldestSeq } from "./state.js";
import type { Intents } from "./view.js";

/** Messages per history page. */
const HISTORY_PAGE = 30;

/** Carries out the view's intents against the store and the current connection. */
export class Actions implements Intents {
  private conn: Connection | null = null;
  /** Per conversation, the seq last sent in a MarkRead. */
  private readonly marked = new Map<string, number>();
  /** Sign-ins so far: a session's end is acted on only if it is still the latest. */
  private generation = 0;
  /** The connection switch in progress (sign-in, sign-out), so they run in order. */
  private switching: Promise<void> = Promise.resolve();

  constructor(
    private readonly store: Store,
    private readonly storage: Storage,
  ) {
    store.subscribe(() => this.markViewedRead());
    document.addEventListener("visibilitychange", () => this.markViewedRead());
  }

  signIn(serverUrl: string, token: string): void {
    let url: string;
    let me: string;
    try {
      url = checkServerUrl(serverUrl);
      me = tokenUser(token);
    } catch (e) {
      const text = e instanceof SignInError ? e.message : String(e);
      this.store.dispatch({ type: "signed-out", notice: text });
      return;
    }
    saveSession(this.storage, { serverUrl: url, token: token.trim() });
    this.marked.clear();
    this.store.dispatch({ type: "signing-in", serverUrl: url, me });
    const generation = ++this.generation;
    const ended = (why: string): void => {
      if (generation !== this.generation) return; // an older session's end
      // The server refused the session: forget it, so a reload does not retry it.
      clearSession(this.storage);
      this.replaceConnection(null);
      this.store.dispatch({ type: "signed-out", notice: `Signed out: ${why}` });
    };
    this.replaceConnection(() => Connection.start(this.store, me, url, token.trim(), ended));
  }

  /** Closes the current connection, then opens `next` (in order, one at a time). */
  private replaceConnection(next: (() => Promise<Connection>) | null): void {
    this.switching = this.switching
      .then(async () => {
        const old = this.conn;
        this.conn = null;
        if (old) await old.close().catch(() => undefined);
        if (next) this.conn = await next();
      })
      .catch((e: unknown) => {
        clearSession(this.storage);
        this.store.dispatch({ type: "signed-out", notice: e instanceof Error ? e.message : String(e) });
      });
  }

  signOut(): void {
    clearSession(this.storage);
    this.generation++;
    this.replaceConnection(null);
    this.store.dispatch({ type: "signed-out", notice: "" });
  }

  select(conversationId: string): void {
    this.store.dispatch({ type: "select", conversationId });
    this.openFirstPage(conversationId);
  }

  openDirect(user: string): void {
    const me = this.store.state.me;
    const id = directConversationId(me, user);
    this.store.dispatch({ type: "open-direct", conversationId: id, peer: user });
    this.openFirstPage(id);
    void this.conn?.watchPresence();
  }

  private openFirstPage(id: string): void {
    const c = this.store.state.conversations.get(id);
    if (c && !c.opened && !c.loadingOlder) this.fetchOlder(c, 0);
  }

  send(text: string): void {
    const s = this.store.state;
    const c = s.selected ? s.conversations.get(s.selected) : undefined;
    if (!c || !this.conn) return;
    const target: Target = c.kind === "group" ? { group: c.name } : { to: c.name };
    const clientMsgId = newClientMsgId();
    this.store.dispatch({ type: "queued", conversationId: c.id, clientMsgId, text, time: Date.now() });
    this.conn.client.send(target, text, { clientMsgId }).catch((e: unknown) => {
      // Closing the client leaves the message in the outbox for the next session.
      const kind = (e as { kind?: string }).kind;
      if (kind === "client_closed") return;
      this.store.dispatch({ type: "send-failed", clientMsgId, reason: e instanceof Error ? e.message : String(e) });
    });
  }

  loadOlder(): void {
    const s = this.store.state;
    const c = s.selected ? s.conversations.get(s.selected) : undefined;
    if (!c || !c.hasOlder || c.loadingOlder) return;
    this.fetchOlder(c, oldestSeq(c));
  }

  private fetchOlder(c: Conversation, beforeSeq: number): void {
    const conn = this.conn;
    if (!conn) return;
    const id = c.id;
    this.store.dispatch({ type: "history-loading", conversationId: id });
    conn.client.fetchHistory(id, { beforeSeq, limit: HISTORY_PAGE }).then(
      (page) => {
        if (this.conn !== conn) return; // signed out (or in again) meanwhile
        const list = page.messages.flatMap((m) => {
          const x = incoming(m);
          return x ? [x] : [];
        });
        this.store.dispatch({ type: "history", conversationId: id, list, more: page.more });
      },
      (e: unknown) => {
        if (this.conn !== conn) return;
        const text = `Could not load history: ${e instanceof Error ? e.message : String(e)}`;
        this.store.dispatch({ type: "history-failed", conversationId: id, notice: text });
      },
    );
  }

  typing(): void {
    const id = this.store.state.selected;
    if (id && this.conn) this.conn.client.typing(id, true).catch(() => undefined);
  }

  /** Marks the selected conversation read up to what is shown, when the page is visible. */
  private markViewedRead(): void {
    const s = this.store.state;
    const c = s.selected ? s.conversations.get(s.selected) : undefined;
    if (!c || !this.conn || s.status !== "online" || document.visibilityState !== "visible") return;
    const seq = lastStoredSeq(c);
    if (seq <= (this.marked.get(c.id) ?? 0)) return;
    this.marked.set(c.id, seq);
    const id = c.id;
    const conn = this.conn;
    conn.client.markRead(id, seq).then(
      () => {
        if (this.conn === conn) this.store.dispatch({ type: "read", conversationId: id, seq });
      },
      () => this.marked.delete(id), // tried again at the next change
    );
  }
}
