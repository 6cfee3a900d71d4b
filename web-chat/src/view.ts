/**
 * The DOM: renders a {@link State} into the page (index.html's skeleton) and turns
 * clicks, keys and scrolls into {@link Intents}. It reads the state and never changes
 * it; message text only ever goes in as text.
 */
import { byId, clock, el, keyedChildren, setAttr, setText, show } from "./dom.js";
import { type ChatMsg, type Conversation, type State, peerOf, sortedConversations } from "./state.js";

/** What the user asks for; actions.ts carries it out. */
export interface Intents {
  signIn(serverUrl: string, token: string): void;
  signOut(): void;
  select(conversationId: string): void;
  openDirect(user: string): void;
  send(text: string): void;
  loadOlder(): void;
  typing(): void;
}

/** How near the top (px) a scroll-up starts loading older messages. */
const LOAD_OLDER_PX = 40;

/** Where the message pane was before a render, to keep the reader's place. */
interface ScrollMark {
  conversation: string | null;
  firstKey: string | undefined;
  atBottom: boolean;
  height: number;
  top: number;
}

/** The rendered page. */
export class View {
  private readonly pane = byId("messages-pane", HTMLDivElement);
  private readonly list = byId("messages", HTMLOListElement);
  private shownConversation: string | null = null;
  /** The list items made so far, by conversation id and by message key. */
  private readonly convItems = new Map<string, HTMLLIElement>();
  private readonly msgItems = new Map<string, HTMLLIElement>();

  /** Binds the page's inputs to `intents`. */
  constructor(private readonly intents: Intents) {
    this.bindSignIn();
    this.bindChat();
  }

  private bindSignIn(): void {
    byId("signin-form", HTMLFormElement).addEventListener("submit", (ev) => {
      ev.preventDefault();
      const url = byId("signin-url", HTMLInputElement).value;
      const token = byId("signin-token", HTMLTextAreaElement).value;
      this.intents.signIn(url, token);
    });
    byId("signout", HTMLButtonElement).addEventListener("click", () => this.intents.signOut());
  }

  private bindChat(): void {
    byId("new-chat", HTMLFormElement).addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = byId("new-chat-user", HTMLInputElement);
      const user = input.value.trim();
      if (user) this.intents.openDirect(user);
      input.value = "";
    });
    const text = byId("composer-text", HTMLInputElement);
    byId("composer", HTMLFormElement).addEventListener("submit", (ev) => {
      ev.preventDefault();
      if (text.value.trim()) this.intents.send(text.value);
      text.value = "";
      text.focus();
    });
    text.addEventListener("input", () => this.intents.typing());
    byId("load-older", HTMLButtonElement).addEventListener("click", () => this.intents.loadOlder());
    this.pane.addEventListener("scroll", () => {
      if (this.pane.scrollTop < LOAD_OLDER_PX) this.intents.loadOlder();
    });
    byId("conversations", HTMLUListElement).addEventListener("click", (ev) => {
      const item = ev.target instanceof Element ? ev.target.closest("li[data-id]") : null;
      const id = item?.getAttribute("data-id");
      if (id) this.intents.select(id);
    });
  }

  /** Shows the sign-in form prefilled with `serverUrl` and an error, if any. */
  showSignIn(serverUrl: string, error: string): void {
    show(byId("app", HTMLElement), false);
    show(byId("signin", HTMLElement), true);
    const url = byId("signin-url", HTMLInputElement);
    if (!url.value) url.value = serverUrl;
    byId("signin-error", HTMLParagraphElement).textContent = error;
  }

  /** Renders the whole state. */
  render(s: State, now: number): void {
    if (s.status === "signed-out") {
      this.showSignIn(s.serverUrl, s.notice);
      return;
    }
    show(byId("signin", HTMLElement), false);
    show(byId("app", HTMLElement), true);
    byId("me", HTMLSpanElement).textContent = s.me;
    const status = byId("status", HTMLSpanElement);
    status.textContent = s.status;
    status.className = `status-${s.status}`;
    show(byId("offline-banner", HTMLDivElement), s.status === "offline");
    const notice = byId("notice", HTMLParagraphElement);
    notice.textContent = s.notice;
    show(notice, s.notice !== "");
    let unread = 0;
    for (const c of s.conversations.values()) unread += c.unread;
    document.title = unread > 0 ? `(${unread}) im web chat` : "im web chat";
    this.renderList(s);
    this.renderConversation(s, now);
  }

  private renderList(s: State): void {
    keyedChildren(
      byId("conversations", HTMLUListElement),
      this.convItems,
      sortedConversations(s),
      (c) => c.id,
      (c) => el("li", { "data-id": c.id }, el("span"), el("span", { class: "conv-name" }), el("span"), el("span", { class: "conv-last" })),
      (li, c) => updateConversationItem(li, c, s),
    );
  }

  private renderConversation(s: State, now: number): void {
    const c = s.selected ? s.conversations.get(s.selected) : undefined;
    show(byId("empty-hint", HTMLParagraphElement), !c);
    show(byId("conv-header", HTMLElement), !!c);
    show(this.pane, !!c);
    show(byId("composer", HTMLFormElement), !!c);
    if (!c) {
      this.shownConversation = null;
      return;
    }
    const peer = peerOf(c.id, s.me);
    byId("conv-name", HTMLSpanElement).textContent = c.kind === "group" ? `# ${c.name}` : c.name;
    byId("conv-dot", HTMLSpanElement).className = peer !== null && s.online.has(peer) ? "dot online" : "dot";
    const typing = c.typing && c.typing.until > now ? `${c.typing.user} is typing…` : "";
    byId("typing", HTMLSpanElement).textContent = typing;
    const older = byId("load-older", HTMLButtonElement);
    show(older, c.hasOlder);
    older.disabled = c.loadingOlder;
    older.textContent = c.loadingOlder ? "Loading…" : "Load older messages";
    this.renderMessages(s, c);
  }

  private renderMessages(s: State, c: Conversation): void {
    const mark = this.scrollMark();
    const switched = mark.conversation !== c.id;
    if (switched) {
      this.list.replaceChildren();
      this.msgItems.clear();
    }
    keyedChildren(this.list, this.msgItems, c.messages, (m) => m.key, (m) => messageItem(m, s.me), (li, m) =>
      updateMessageItem(li, m, c.peerReadSeq),
    );
    this.shownConversation = c.id;
    if (switched || mark.atBottom) {
      this.pane.scrollTop = this.pane.scrollHeight;
    } else if (mark.firstKey !== c.messages[0]?.key) {
      // Older messages came in above: keep the ones being read where they were.
      this.pane.scrollTop = this.pane.scrollHeight - mark.height + mark.top;
    }
  }

  private scrollMark(): ScrollMark {
    const p = this.pane;
    return {
      conversation: this.shownConversation,
      firstKey: this.list.firstElementChild?.getAttribute("data-key") ?? undefined,
      atBottom: p.scrollHeight - p.scrollTop - p.clientHeight < 30,
      height: p.scrollHeight,
      top: p.scrollTop,
    };
  }
}

/** What the sender sees under their own message. */
function deliveryState(m: ChatMsg, peerReadSeq: number): string {
  if (m.failed) return `not sent: ${m.failed}`;
  if (m.pending) return m.stored ? "saved" : "sending…";
  return m.seq <= peerReadSeq ? "read" : "sent";
}

function messageItem(m: ChatMsg, me: string): HTMLLIElement {
  const mine = m.sender === me;
  return el(
    "li",
    { "data-key": m.key },
    !mine && el("span", { class: "sender" }, m.sender),
    el("span", { class: "text" }, m.text),
    el("span", { class: "meta" }, el("span", { class: "time" }), mine && el("span", { class: "delivery" })),
  );
}

function updateMessageItem(li: HTMLLIElement, m: ChatMsg, peerReadSeq: number): void {
  const mine = li.querySelector(".delivery");
  const cls = ["msg", mine ? "mine" : "theirs", m.pending ? "pending" : "", m.failed ? "failed" : ""];
  setAttr(li, "class", cls.filter(Boolean).join(" "));
  setAttr(li, "data-seq", String(m.seq));
  const time = li.querySelector(".time");
  if (time) setText(time, clock(m.time));
  if (mine) setText(mine, deliveryState(m, peerReadSeq));
}

function updateConversationItem(li: HTMLLIElement, c: Conversation, s: State): void {
  const [dot, name, unread, last] = li.children;
  const peer = peerOf(c.id, s.me);
  setAttr(li, "class", c.id === s.selected ? "conv selected" : "conv");
  if (dot) setAttr(dot, "class", peer !== null && s.online.has(peer) ? "dot online" : "dot");
  if (name) setText(name, c.name);
  if (unread) {
    setAttr(unread, "class", c.unread > 0 ? "unread" : "unread none");
    setText(unread, c.unread > 0 ? String(c.unread) : "");
  }
  if (last) setText(last, c.lastText);
}
