// The connection state machine against a scripted socket (the e2e tests run the same
// paths against the real server; this pins the close-code policy exactly).
import assert from "node:assert/strict";
import { test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import * as pb from "../../src/gen/im/v1/im_pb.js";
import {
  Client,
  KickedError,
  LoginRefusedError,
  TokenExpiredError,
  type ClientEvents,
  type WebSocketConstructor,
} from "../../src/index.js";
import { waitFor } from "../support.js";

type Script = (ws: ScriptedSocket, login: pb.Login) => void;

/** A WebSocket whose server side is a script: it answers Login as `onLogin` says. */
class ScriptedSocket {
  static script: Script = () => undefined;
  static opened = 0;
  static last: ScriptedSocket | undefined;
  /** Called as each socket is made, before it opens. */
  static onConstruct: (() => void) | undefined;
  binaryType = "";
  loginReq = 0n;
  readyState = 0;
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  constructor(readonly url: string) {
    ScriptedSocket.opened += 1;
    ScriptedSocket.last = this;
    ScriptedSocket.onConstruct?.();
    setTimeout(() => {
      this.readyState = 1;
      this.onopen?.({});
    }, 1);
  }
  send(data: Uint8Array): void {
    const f = fromBinary(pb.FrameSchema, data);
    if (f.body.case === "login") {
      this.loginReq = f.reqId;
      ScriptedSocket.script(this, f.body.value);
    }
    if (f.body.case === "sync") this.reply(f.reqId, { case: "syncResp", value: create(pb.SyncResponseSchema, {}) });
  }
  reply(reqId: bigint, body: pb.Frame["body"]): void {
    const data = toBinary(pb.FrameSchema, create(pb.FrameSchema, { reqId, body }));
    setTimeout(() => this.onmessage?.({ data: data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength) }), 1);
  }
  loginOk(user = "u1"): void {
    this.reply(this.loginReq, { case: "loginOk", value: create(pb.LoginOkSchema, { userId: user, sessionId: "s", heartbeatSecs: 30, nodeId: "n1" }) });
  }
  serverClose(code: number, reason: string): void {
    if (this.readyState === 3) return;
    this.readyState = 3;
    setTimeout(() => this.onclose?.({ code, reason }), 1);
  }
  close(code?: number, reason?: string): void {
    this.serverClose(code ?? 1000, reason ?? "");
  }
}

function client(extra: Partial<ConstructorParameters<typeof Client>[0]> = {}): { c: Client; log: string[] } {
  const c = new Client({
    url: "ws://127.0.0.1:1/ws",
    token: "t0",
    routeUrl: null,
    webSocket: ScriptedSocket as unknown as WebSocketConstructor,
    reconnectMinMs: 5,
    reconnectMaxMs: 20,
    ...extra,
  });
  const log: string[] = [];
  c.on("state", (s: ClientEvents["state"]) => log.push(s.state));
  return { c, log };
}

test("connects, reconnects after a drop, and stops on close()", async () => {
  ScriptedSocket.script = (ws) => ws.loginOk();
  const { c, log } = client();
  const s = await c.connect();
  assert.deepEqual([s.userId, s.nodeId, c.state], ["u1", "n1", "connected"]);
  ScriptedSocket.last?.serverClose(1006, "gone");
  await waitFor("reconnected", () => log.filter((x) => x === "connected").length === 2);
  assert.deepEqual(log, ["connecting", "connected", "disconnected", "connecting", "connected"]);
  await c.close();
  assert.equal(c.state, "closed");
});

test("4003 asks the provider for a fresh token before reconnecting; without one, TokenExpiredError", async () => {
  const logins: string[] = [];
  ScriptedSocket.script = (ws, l) => (logins.push(l.token), ws.loginOk());
  const { c } = client({ getToken: async () => "t1" });
  await c.connect();
  ScriptedSocket.last?.serverClose(4003, "token expired");
  await waitFor("second login", () => logins.length === 2);
  assert.deepEqual(logins, ["t0", "t1"]);
  await c.close();

  const { c: c2 } = client();
  let closed: ClientEvents["closed"] | undefined;
  c2.on("closed", (e) => (closed = e));
  await c2.connect();
  ScriptedSocket.last?.serverClose(4003, "token revoked");
  await waitFor("closed", () => closed !== undefined);
  assert.ok(closed?.error instanceof TokenExpiredError);
});

test("4002 kicked is terminal", async () => {
  ScriptedSocket.script = (ws) => ws.loginOk();
  const { c } = client();
  let closed: ClientEvents["closed"] | undefined;
  c.on("closed", (e) => (closed = e));
  await c.connect();
  ScriptedSocket.last?.serverClose(4002, "kicked by operator");
  await waitFor("closed", () => closed !== undefined);
  assert.ok(closed?.error instanceof KickedError);
  assert.equal(c.state, "closed");
});

test("a refused login stops with LoginRefusedError after one fresh token, never looping", async () => {
  ScriptedSocket.script = (ws) => {
    ws.reply(ws.loginReq, { case: "error", value: create(pb.ErrorSchema, { code: pb.ErrorCode.UNAUTHENTICATED, message: "bad token" }) });
    ws.serverClose(1008, "login");
  };
  ScriptedSocket.opened = 0;
  let calls = 0;
  const { c } = client({ getToken: async () => (calls++, "t-fresh") });
  await assert.rejects(c.connect(), (e: unknown) => e instanceof LoginRefusedError);
  assert.equal(calls, 1);
  assert.equal(ScriptedSocket.opened, 2);
  assert.equal(c.state, "closed");
});

test("policy closes (1008 flood) back off instead of looping hot", async () => {
  let n = 0;
  ScriptedSocket.script = (ws) => {
    n += 1;
    ws.loginOk();
    setTimeout(() => ws.serverClose(1008, "send flood"), 2);
  };
  const { c } = client({ reconnectMinMs: 40, reconnectMaxMs: 400 });
  const delays: number[] = [];
  c.on("connecting", (e) => delays.push(e.delayMs));
  await c.connect();
  await new Promise((r) => setTimeout(r, 600));
  await c.close();
  assert.ok(n < 12, `${n} connections in 600 ms`);
  assert.ok(delays.slice(1).every((d) => d >= 0 && d <= 400));
});

/** Runs `body` with a browser-like network (window events and `navigator.onLine`). */
async function withBrowserNetwork(body: (goOnline: (on: boolean) => void) => Promise<void>): Promise<void> {
  const g = globalThis as unknown as Record<string, unknown>;
  const et = new EventTarget();
  const nav = { onLine: true };
  const saved = { add: g.addEventListener, remove: g.removeEventListener, navigator: Object.getOwnPropertyDescriptor(globalThis, "navigator") };
  g.addEventListener = et.addEventListener.bind(et);
  g.removeEventListener = et.removeEventListener.bind(et);
  Object.defineProperty(globalThis, "navigator", { value: nav, configurable: true });
  try {
    await body((on) => {
      nav.onLine = on;
      et.dispatchEvent(new Event(on ? "online" : "offline"));
    });
  } finally {
    g.addEventListener = saved.add;
    g.removeEventListener = saved.remove;
    if (saved.navigator) Object.defineProperty(globalThis, "navigator", saved.navigator);
    else delete g.navigator;
  }
}

test("browser offline closes the socket and holds reconnects; online reconnects at once", async () => {
  await withBrowserNetwork(async (goOnline) => {
    ScriptedSocket.script = (ws) => ws.loginOk();
    const { c, log } = client({ reconnectMinMs: 5000, reconnectMaxMs: 5000 });
    await c.connect();
    const opened = ScriptedSocket.opened;
    goOnline(false);
    await waitFor("disconnected", () => c.state !== "connected");
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(ScriptedSocket.opened, opened, "no attempt while offline");
    goOnline(true);
    await waitFor("reconnected at once (not after the 5 s backoff)", () => c.state === "connected", 1000);
    assert.equal(log.filter((x) => x === "connected").length, 2);
    await c.close();
  });
});

test("a socket still opening when the browser goes offline is dropped, not logged in", async () => {
  await withBrowserNetwork(async (goOnline) => {
    ScriptedSocket.script = (ws) => ws.loginOk();
    const { c } = client({ reconnectMinMs: 5000, reconnectMaxMs: 5000 });
    const opened = ScriptedSocket.opened;
    // Offline while the first socket is being made, before it opens.
    ScriptedSocket.onConstruct = () => {
      ScriptedSocket.onConstruct = undefined;
      goOnline(false);
    };
    const connecting = c.connect();
    try {
      await new Promise((r) => setTimeout(r, 100));
      assert.notEqual(c.state, "connected");
      assert.equal(ScriptedSocket.last?.readyState, 3, "the socket opened offline was closed");
      assert.equal(ScriptedSocket.opened, opened + 1, "no attempt while offline");
      goOnline(true);
      await connecting;
      await waitFor("connected once back online", () => c.state === "connected", 1000);
    } finally {
      await c.close();
    }
  });
});
