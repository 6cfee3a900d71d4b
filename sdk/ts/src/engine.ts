/**
 * The engine behind {@link Client}: the connection state machine (route, connect,
 * login, heartbeat, token refresh, the close-code policy and reconnect with backoff),
 * one request/response path keyed by req_id, and the frame dispatch that feeds the
 * tracker, the sync engine and the outbox. Data flows one way: socket -> dispatch ->
 * tracker/outbox/sync -> events.
 * @module
 */

import { Backoff } from "./backoff.js";
import { toMessage, toPresence, toReceipt, toSendAck, toServerError, toTyping, type Body, type pb } from "./convert.js";
import {
  ClientClosedError,
  DisconnectedError,
  KickedError,
  LoginRefusedError,
  ProtocolError,
  ServerError,
  TimeoutError,
  TokenExpiredError,
  type ImError,
} from "./errors.js";
import type { ClientEvents, ConnectionState } from "./events.js";
import type { ResolvedOptions } from "./options.js";
import { Outbox } from "./outbox.js";
import { browserNetwork } from "./network.js";
import { chooseUrl, RegionBook } from "./route.js";
import { CLIENT_GONE, Socket } from "./socket.js";
import { SyncEngine } from "./sync.js";
import { SeqTracker } from "./tracker.js";
import { refreshDelay, tokenExp } from "./token.js";
import type { Message, Session } from "./types.js";
import { FrameOut, wireEntry } from "./wire.js";

/** A connection that stayed up this long resets the reconnect backoff. */
const STABLE_MS = 10_000;
/** No frame for this many heartbeats: the connection is dead. */
const DEAD_AFTER_HEARTBEATS = 3;
/** A live message above a hole waits this long for the hole to fill before a sync. */
const GAP_WAIT_MS = 1000;
/** Retry of a refused token refresh. */
const REFRESH_RETRY_MS = 1000;
/** Own client_msg_ids remembered to keep own messages out of `message` events. */
const OWN_IDS_MAX = 10_000;

type Emit = <K extends keyof ClientEvents>(event: K, payload: ClientEvents[K]) => void;

interface Pending {
  go: () => void;
  fail: (e: ImError) => void;
  timer: ReturnType<typeof setTimeout>;
}

interface Waiting {
  resolve: (body: Body) => void;
  reject: (e: ImError) => void;
  timer: ReturnType<typeof setTimeout>;
}

/** The value of the body case `C`. */
type Answer<C> = Extract<Body, { case: C }> extends { value: infer V } ? V : never;

type LoginResult = { ok: Session } | { refused: ImError; fatal: boolean };

/** Internal: one client's connection, requests and dispatch. */
export class Engine {
  /** The connection state. */
  state: ConnectionState = "disconnected";
  /** The current session. */
  session: Session | undefined;
  /** The seq tracker (order and exactly-once). */
  readonly tracker = new SeqTracker();
  /** The outbox. */
  readonly outbox: Outbox;
  /** The sync engine. */
  readonly sync: SyncEngine;
  /** Presence watch list, re-sent after reconnects. */
  presenceWatch: string[] | undefined;
  /** Presence hidden flag, re-sent after reconnects. */
  presenceHidden: boolean | undefined;

  private socket: Socket | undefined;
  private token: string | undefined;
  private nextReq = 1n;
  private readonly requests = new Map<bigint, Waiting>();
  private readonly outboxReqs = new Map<bigint, string>();
  private readonly onConnect: Pending[] = [];
  private readonly ownIds = new Set<string>();
  private readonly backoff: Backoff;
  private login: { reqId: bigint; done: (r: LoginResult) => void } | undefined;
  private refresh: { reqId: bigint; token: string } | undefined;
  private timers = new Map<string, ReturnType<typeof setTimeout>>();
  private lastRx = 0;
  private lostNode: string | undefined;
  /** The probed regions (multi-region mode), nearest first. */
  readonly regions = new RegionBook();
  private closed = false;
  private closeWake: (() => void) | undefined;
  private offline = false;
  private unwatch: (() => void) | undefined;
  private firstLogin: { resolve: (s: Session) => void; reject: (e: ImError) => void } | undefined;

  /** @param opts - resolved options. @param emit - the client's event emitter. */
  constructor(
    private readonly opts: ResolvedOptions,
    private readonly emit: Emit,
  ) {
    this.token = opts.token;
    this.backoff = new Backoff(opts.reconnectMinMs, opts.reconnectMaxMs);
    this.outbox = new Outbox(opts.outboxMax, opts.outboxStore);
    this.sync = new SyncEngine(this.tracker, {
      request: (cursors, limit) => this.sendSync(cursors, limit),
      emit: (msgs) => this.deliver(msgs),
      finished: (r) => {
        if (r.error) this.emit("error", r.error);
        else this.emit("synced", { messages: r.messages });
        this.scheduleAcks();
      },
    });
  }

  private setState(state: ConnectionState): void {
    const previous = this.state;
    if (previous === state) return;
    this.state = state;
    this.emit("state", { state, previous });
  }

  private timer(name: string, ms: number, fn: () => void): void {
    this.clearTimer(name);
    this.timers.set(
      name,
      setTimeout(() => {
        this.timers.delete(name);
        fn();
      }, ms),
    );
  }

  private clearTimer(name: string): void {
    const t = this.timers.get(name);
    if (t !== undefined) clearTimeout(t);
    this.timers.delete(name);
  }

  /** Starts the loop; resolves at the first login. */
  start(): Promise<Session> {
    if (this.closed) return Promise.reject(new ClientClosedError("the client is closed"));
    if (this.firstLogin || this.session) {
      return this.session ? Promise.resolve(this.session) : new Promise((res, rej) => this.onFirst(res, rej));
    }
    const p = new Promise<Session>((resolve, reject) => (this.firstLogin = { resolve, reject }));
    void this.run();
    return p;
  }

  private onFirst(res: (s: Session) => void, rej: (e: ImError) => void): void {
    const prev = this.firstLogin;
    this.firstLogin = {
      resolve: (s) => (prev?.resolve(s), res(s)),
      reject: (e) => (prev?.reject(e), rej(e)),
    };
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.closeWake = undefined;
        resolve();
      }, ms);
      this.closeWake = () => {
        clearTimeout(t);
        resolve();
      };
    });
  }

  /** Follows the browser's network: offline closes the socket, online reconnects at once. */
  private watchNetwork(): void {
    const net = this.opts.watchNetwork ? browserNetwork() : undefined;
    if (!net) return;
    this.offline = !net.online();
    this.unwatch = net.subscribe((online) => {
      this.offline = !online;
      if (!online) this.socket?.close(CLIENT_GONE, "browser offline");
      else this.closeWake?.();
    });
  }

  /** Waits while the browser is offline (woken by `online` or close()). */
  private async whileOffline(): Promise<void> {
    while (this.offline && !this.closed) await this.sleep(60_000);
  }

  /** The reconnect loop: runs until close() or a terminal refusal. */
  private async run(): Promise<void> {
    this.watchNetwork();
    try {
      this.outbox.restore(await this.outbox.store.load());
    } catch (e) {
      this.emit("error", new ProtocolError(`outbox store load failed: ${String(e)}`));
    }
    let needToken = this.token === undefined;
    let delay = 0;
    while (!this.closed) {
      this.setState("connecting");
      this.emit("connecting", { attempt: this.backoff.attempts, delayMs: delay });
      if (delay > 0) await this.sleep(delay);
      await this.whileOffline();
      if (this.closed) break;
      const next = await this.attempt(needToken);
      if (this.closed) break;
      if (next.fatal) {
        this.terminate(next.fatal);
        return;
      }
      needToken = next.needToken;
      delay = next.quick ? Math.min(this.backoff.next(), 250) : this.backoff.next();
      // Offline: no backoff to sit out once the network is back.
      if (this.offline) delay = 0;
    }
  }

  /** One connection, from route to loss: what the loop should do next. */
  private async attempt(needToken: boolean): Promise<{ needToken: boolean; fatal?: ImError; quick?: boolean }> {
    if (needToken) {
      if (!this.opts.getToken) return { needToken, fatal: new TokenExpiredError("the token expired and no getToken was given") };
      try {
        this.token = await this.opts.getToken();
      } catch (e) {
        this.emit("error", new TokenExpiredError(`getToken failed: ${String(e)}`));
        return { needToken: true };
      }
    }
    const route = await chooseUrl(this.opts.routeUrl, this.opts.url, this.lostNode, Math.min(3000, this.opts.connectTimeoutMs), this.regions);
    if (route.error) this.emit("error", new ProtocolError(`${route.error}; connecting to ${route.url}`));
    let closedWith: (c: { code: number; reason: string }) => void = () => undefined;
    const lost = new Promise<{ code: number; reason: string }>((resolve) => (closedWith = resolve));
    let socket: Socket;
    try {
      socket = await Socket.open(this.opts.webSocket, route.url, this.opts.connectTimeoutMs, {
        frames: (f) => this.onFrames(f),
        undecodable: (e) => this.emit("error", new ProtocolError(`undecodable frame: ${String(e)}`)),
        closed: (code, reason) => closedWith({ code, reason }),
      });
    } catch (e) {
      const reason = e instanceof Error ? e.message : String(e);
      this.emit("disconnected", { code: 1006, reason, willReconnect: !this.closed });
      return { needToken: false };
    }
    if (this.closed) {
      socket.close(1000, "client closed");
      return { needToken: false };
    }
    if (this.offline) {
      // The network went away while this socket was opening: drop it and wait for online.
      socket.close(CLIENT_GONE, "browser offline");
      this.emit("disconnected", { code: CLIENT_GONE, reason: "browser offline", willReconnect: true });
      return { needToken: false };
    }
    this.socket = socket;
    const login = await this.doLogin(socket, lost);
    if ("refused" in login) {
      socket.close(CLIENT_GONE, "login refused");
      this.socket = undefined;
      const c = await lost;
      const fatal = login.fatal && !(this.opts.getToken && !needToken) ? login.refused : undefined;
      this.emit("disconnected", { code: c.code, reason: c.reason || login.refused.message, willReconnect: !fatal && !this.closed });
      // A refused token is tried once more with a fresh one from getToken.
      return fatal ? { needToken: false, fatal } : { needToken: login.fatal };
    }
    const since = Date.now();
    this.connected(login.ok, route.url);
    const c = await lost;
    this.lost(c.code, c.reason);
    if (Date.now() - since >= STABLE_MS) this.backoff.reset();
    return this.afterClose(c.code, c.reason);
  }

  /** The close-code policy after a logged-in connection ended. */
  private afterClose(code: number, reason: string): { needToken: boolean; fatal?: ImError; quick?: boolean } {
    if (this.closed) return { needToken: false };
    this.emit("disconnected", { code, reason, willReconnect: code !== 4002 && !this.closed });
    if (code === 4002) return { needToken: false, fatal: new KickedError(reason) };
    if (code === 4003) return { needToken: true };
    // Shutting down: go to another node soon.
    if (code === 1001) return { needToken: false, quick: true };
    return { needToken: false };
  }

  private doLogin(socket: Socket, lost: Promise<{ code: number; reason: string }>): Promise<LoginResult> {
    return new Promise((resolve) => {
      const reqId = this.alloc();
      const done = (r: LoginResult): void => {
        clearTimeout(t);
        this.login = undefined;
        resolve(r);
      };
      const t = setTimeout(
        () => done({ refused: new TimeoutError("login timed out"), fatal: false }),
        this.opts.connectTimeoutMs,
      );
      this.login = { reqId, done };
      void lost.then((c) => {
        if (this.login?.reqId !== reqId) return;
        // Closed 1008 before LoginOk: the token (or user) was refused.
        const refused = new LoginRefusedError(c.code, c.reason);
        done({ refused, fatal: c.code === 1008 && /token|login|auth/i.test(c.reason) });
      });
      const login = { token: this.token ?? "", deviceId: this.opts.deviceId, resume: this.session !== undefined };
      socket.send(reqId, { case: "login", value: FrameOut.login(login) });
    });
  }

  private loginAnswer(f: pb.Frame): boolean {
    const login = this.login;
    if (!login || f.reqId !== login.reqId) return false;
    if (f.body.case === "loginOk") {
      const ok = f.body.value;
      login.done({ ok: { userId: ok.userId, sessionId: ok.sessionId, nodeId: ok.nodeId, heartbeatSecs: ok.heartbeatSecs } });
    } else if (f.body.case === "error") {
      const err = toServerError(f.body.value);
      const refused = new LoginRefusedError(0, `${err.code}: ${err.serverMessage}`);
      login.done({ refused, fatal: err.code === "UNAUTHENTICATED" });
    }
    return true;
  }

  private connected(session: Session, url: string): void {
    this.session = session;
    this.lostNode = session.nodeId;
    this.lastRx = Date.now();
    this.setState("connected");
    this.emit("connected", { ...session, url });
    this.firstLogin?.resolve(session);
    this.firstLogin = undefined;
    this.startHeartbeat(session);
    this.planRefresh();
    this.resendPresence();
    this.sync.kick();
    this.pump();
    for (const p of this.onConnect.splice(0)) {
      clearTimeout(p.timer);
      p.go();
    }
  }

  private lost(code: number, reason: string): void {
    this.socket = undefined;
    for (const name of ["heartbeat", "acks", "refresh", "gap", "pump", "syncTimeout"]) this.clearTimer(name);
    this.refresh = undefined;
    this.sync.abort();
    this.outbox.disconnected();
    this.outboxReqs.clear();
    const err = new DisconnectedError(`connection lost (close ${code}${reason ? `: ${reason}` : ""})`);
    for (const [id, w] of this.requests) {
      clearTimeout(w.timer);
      w.reject(err);
      this.requests.delete(id);
    }
    if (!this.closed) this.setState("disconnected");
  }

  private startHeartbeat(session: Session): void {
    const every = this.opts.heartbeatMs ?? (session.heartbeatSecs > 0 ? session.heartbeatSecs * 1000 : 30_000);
    const beat = (): void => {
      const socket = this.socket;
      if (!socket) return;
      if (Date.now() - this.lastRx > every * DEAD_AFTER_HEARTBEATS) {
        socket.close(CLIENT_GONE, `no frame from the server for ${Date.now() - this.lastRx} ms`);
        return;
      }
      socket.send(this.alloc(), { case: "ping", value: FrameOut.ping(Date.now()) });
      this.timer("heartbeat", every, beat);
    };
    this.timer("heartbeat", every, beat);
  }

  private planRefresh(): void {
    this.clearTimer("refresh");
    const exp = this.token ? tokenExp(this.token) : undefined;
    if (!this.opts.getToken || exp === undefined) return;
    this.timer("refresh", refreshDelay(exp, Date.now(), this.opts.refreshBeforeExpMs), () => void this.refreshNow());
  }

  private async refreshNow(): Promise<void> {
    const socket = this.socket;
    if (!socket || !this.opts.getToken) return;
    let token: string;
    try {
      token = await this.opts.getToken();
    } catch (e) {
      this.emit("error", new TokenExpiredError(`getToken failed: ${String(e)}`));
      this.timer("refresh", REFRESH_RETRY_MS, () => void this.refreshNow());
      return;
    }
    if (this.socket !== socket) return;
    const reqId = this.alloc();
    this.refresh = { reqId, token };
    socket.send(reqId, { case: "login", value: FrameOut.login({ token, deviceId: this.opts.deviceId, resume: true }) });
  }

  private refreshAnswer(f: pb.Frame): boolean {
    const r = this.refresh;
    if (!r || f.reqId !== r.reqId) return false;
    this.refresh = undefined;
    if (f.body.case === "loginOk") {
      this.token = r.token;
      this.emit("tokenRefreshed", { exp: tokenExp(r.token) });
      this.planRefresh();
    } else {
      if (f.body.case === "error") this.emit("error", toServerError(f.body.value));
      this.timer("refresh", REFRESH_RETRY_MS, () => void this.refreshNow());
    }
    return true;
  }

  private resendPresence(): void {
    const s = this.socket;
    if (!s) return;
    if (this.presenceHidden !== undefined) {
      s.send(this.alloc(), { case: "setPresence", value: FrameOut.setPresence(this.presenceHidden) });
    }
    if (this.presenceWatch && this.presenceWatch.length > 0) {
      s.send(this.alloc(), { case: "presenceSubscribe", value: FrameOut.presenceSubscribe(this.presenceWatch) });
    }
  }

  private alloc(): bigint {
    const id = this.nextReq;
    this.nextReq += 1n;
    return id;
  }

  private sendSync(cursors: Array<[string, number]>, limit: number): bigint | undefined {
    const s = this.socket;
    if (!s || this.state !== "connected") return undefined;
    const id = this.alloc();
    s.send(id, { case: "sync", value: FrameOut.sync(cursors, limit) });
    this.timer("syncTimeout", this.opts.requestTimeoutMs, () => {
      if (this.sync.owns(id)) this.sync.fail(new TimeoutError("sync page timed out"));
    });
    return id;
  }

  // ---- dispatch ----

  private onFrames(frames: pb.Frame[]): void {
    this.lastRx = Date.now();
    for (const f of frames) {
      if (this.loginAnswer(f) || this.refreshAnswer(f)) continue;
      this.dispatch(f);
    }
  }

  private dispatch(f: pb.Frame): void {
    const b = f.body;
    switch (b.case) {
      case "deliver":
        return this.onDeliver(b.value.messages);
      case "syncResp":
        if (f.reqId === 0n) {
          if (b.value.more) this.sync.kick();
        } else if (this.sync.owns(f.reqId)) {
          this.clearTimer("syncTimeout");
          this.sync.onPage(b.value.messages.map(toMessage), b.value.more);
          this.scheduleAcks();
        }
        return;
      case "readReceipt":
        return this.emit("receipt", toReceipt(b.value));
      case "presence":
        return this.emit("presence", toPresence(b.value));
      case "typing":
        if (f.reqId === 0n) return this.emit("typing", toTyping(b.value));
        return this.complete(f.reqId, b);
      case "sendAck":
        return this.onSendAck(f.reqId, b.value);
      case "error":
        return this.onError(f.reqId, b.value);
      default:
        return this.complete(f.reqId, b);
    }
  }

  private onDeliver(messages: pb.ChatMessage[]): void {
    for (const wire of messages) {
      const arrival = this.tracker.arrive(toMessage(wire));
      if (arrival.gap) {
        // Pushes and own acks may cross: give the hole a moment to fill, then sync.
        if (!this.timers.has("gap")) this.timer("gap", GAP_WAIT_MS, () => this.tracker.hasHeld() && this.sync.kick());
      }
      this.deliver(arrival.ready);
    }
    this.scheduleAcks();
  }

  /** Hands in-order messages to the app, minus this device's own sends. */
  private deliver(msgs: Message[]): void {
    const me = this.session?.userId;
    for (const m of msgs) {
      if (m.sender === me && m.clientMsgId !== "" && this.ownIds.has(m.clientMsgId)) continue;
      this.emit("message", m);
    }
  }

  private onSendAck(reqId: bigint, wire: pb.SendAck): void {
    const ack = toSendAck(wire);
    this.outboxReqs.delete(reqId);
    this.rememberOwn(ack.clientMsgId);
    this.deliver(this.tracker.own(ack.conversationId, ack.seq).ready);
    this.scheduleAcks();
    if (this.outbox.acked(ack)) {
      this.emit("acked", ack);
      this.outbox.store.delete(ack.clientMsgId).catch((e: unknown) => this.emit("error", new ProtocolError(`outbox store: ${String(e)}`)));
      this.pump();
    } else {
      this.complete(reqId, { case: "sendAck", value: wire });
    }
  }

  private rememberOwn(id: string): void {
    if (id === "") return;
    this.ownIds.add(id);
    if (this.ownIds.size > OWN_IDS_MAX) {
      const first = this.ownIds.values().next().value;
      if (first !== undefined) this.ownIds.delete(first);
    }
  }

  private onError(reqId: bigint, wire: pb.Error): void {
    const err = toServerError(wire);
    const cmid = this.outboxReqs.get(reqId);
    if (cmid !== undefined) {
      this.outboxReqs.delete(reqId);
      const r = this.outbox.refused(cmid, err, Date.now());
      if (r === "failed") {
        this.emit("sendFailed", { clientMsgId: cmid, error: err });
        this.outbox.store.delete(cmid).catch(() => undefined);
      }
      this.pump();
      return;
    }
    if (this.sync.owns(reqId)) {
      this.clearTimer("syncTimeout");
      return this.sync.onError(err);
    }
    if (this.requests.has(reqId)) return this.complete(reqId, { case: "error", value: wire });
    this.emit("error", err);
  }

  private scheduleAcks(): void {
    if (this.timers.has("acks")) return;
    this.timer("acks", this.opts.ackDelayMs, () => this.flushAcks());
  }

  /** Sends the DeliverAcks due (batched: one per conversation); returns how many. */
  flushAcks(): number {
    this.clearTimer("acks");
    const s = this.socket;
    if (!s) return 0;
    const acks = this.tracker.takeAcks();
    for (const [conv, seq] of acks) {
      s.send(0n, { case: "deliverAck", value: FrameOut.deliverAck(conv, seq) });
    }
    return acks.length;
  }

  /**
   * Graceful stop: sends the DeliverAcks due and waits (at most `waitMs`) for a Pong
   * behind them, so the server has handled them before the socket closes.
   * @param waitMs - longest wait.
   */
  async drain(waitMs: number): Promise<void> {
    if (this.state !== "connected" || this.flushAcks() === 0) return;
    const ping = this.request({ case: "ping", value: FrameOut.ping(Date.now()) }, "pong").catch(() => undefined);
    await Promise.race([ping, new Promise((r) => setTimeout(r, waitMs))]);
  }

  /** Sends what the outbox lets go now; wakes up again after a pause. */
  pump(): void {
    const s = this.socket;
    if (!s || this.state !== "connected") return;
    const now = Date.now();
    for (const entry of this.outbox.take(now)) {
      const id = this.alloc();
      this.outboxReqs.set(id, entry.clientMsgId);
      this.rememberOwn(entry.clientMsgId);
      s.send(id, wireEntry(entry));
    }
    const wait = this.outbox.pausedFor(now);
    if (wait > 0 && !this.timers.has("pump")) this.timer("pump", wait, () => this.pump());
  }

  // ---- requests ----

  /**
   * Sends a request and waits for its answer body (an Error answer rejects with a
   * {@link ServerError}). Waits for the connection when not connected.
   * @param body - the request. @param expect - the answer's body case.
   */
  request<C extends NonNullable<Body["case"]>>(body: Body, expect: C): Promise<Answer<C>> {
    return new Promise<Answer<C>>((resolve, reject) => {
      if (this.closed) return reject(new ClientClosedError("the client is closed"));
      const deadline = Date.now() + this.opts.requestTimeoutMs;
      const waiting: Pending = {
        go: () => this.sendRequest(body, expect, deadline, resolve, reject),
        fail: reject,
        timer: setTimeout(() => {
          const i = this.onConnect.indexOf(waiting);
          if (i >= 0) this.onConnect.splice(i, 1);
          reject(new TimeoutError(`not connected within ${this.opts.requestTimeoutMs} ms`));
        }, this.opts.requestTimeoutMs),
      };
      if (this.socket && this.state === "connected") {
        clearTimeout(waiting.timer);
        waiting.go();
      } else {
        this.onConnect.push(waiting);
      }
    });
  }

  private sendRequest<V>(body: Body, expect: string, deadline: number, resolve: (v: V) => void, reject: (e: ImError) => void): void {
    const s = this.socket;
    if (!s) return reject(new DisconnectedError("not connected"));
    const id = this.alloc();
    const timer = setTimeout(() => {
      this.requests.delete(id);
      reject(new TimeoutError(`no answer to ${String(body.case)} within ${this.opts.requestTimeoutMs} ms`));
    }, Math.max(1, deadline - Date.now()));
    this.requests.set(id, {
      timer,
      reject,
      resolve: (b) => {
        if (b.case === "error") reject(toServerError(b.value));
        else if (b.case === expect) resolve(b.value as V);
        else reject(new ProtocolError(`expected ${expect}, got ${String(b.case)}`));
      },
    });
    s.send(id, body);
  }

  /** Sends a frame that has no answer (typing is answered but not awaited). @param body - the frame body. */
  fire(body: Body): boolean {
    const s = this.socket;
    if (!s || this.state !== "connected") return false;
    return s.send(this.alloc(), body);
  }

  private complete(reqId: bigint, body: Body): void {
    const w = this.requests.get(reqId);
    if (!w) return;
    this.requests.delete(reqId);
    clearTimeout(w.timer);
    w.resolve(body);
  }

  // ---- shutdown ----

  /** Stops for good. @param err - the reason (undefined: the app closed it). */
  terminate(err?: ImError): void {
    if (this.state === "closed") return;
    this.closed = true;
    this.unwatch?.();
    this.closeWake?.();
    this.flushAcks();
    const s = this.socket;
    this.socket = undefined;
    s?.close(1000, "client closed");
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
    const why = err ?? new ClientClosedError("the client was closed");
    for (const [, w] of this.requests) {
      clearTimeout(w.timer);
      w.reject(why);
    }
    this.requests.clear();
    for (const p of this.onConnect.splice(0)) {
      clearTimeout(p.timer);
      p.fail(why);
    }
    this.outbox.close(why);
    this.sync.close(why);
    this.firstLogin?.reject(why);
    this.firstLogin = undefined;
    this.setState("closed");
    this.emit("closed", err ? { error: err } : {});
  }
}
