/**
 * Test helpers, in one place: start the real im-server binary on free ports with a
 * temp data dir (kill, restart on the same port and data dir), mint HS256 tokens with
 * node:crypto, make SDK clients over the `ws` package, and wait for conditions.
 * @module
 */

import { spawn, type ChildProcess } from "node:child_process";
import { createHmac } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { Client, type ClientOptions, type Message, type WebSocketConstructor } from "../src/index.js";

/** The JWT secret every test server uses. */
export const SECRET = "ts-sdk-test-secret-of-at-least-32-bytes";
/** The admin token every test server uses. */
export const ADMIN_TOKEN = "ts-sdk-admin-token-of-at-least-32-bytes";
/** How long a wait lasts before the test fails. */
export const WAIT_MS = 20_000;
/** The `ws` package's WebSocket as the SDK's constructor type. */
export const NodeWebSocket = WebSocket as unknown as WebSocketConstructor;

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

/** Path of the server binary: IM_SERVER_BIN, else ${CARGO_TARGET_DIR:-<repo>/target}/debug/im-server. */
export function serverBin(): string {
  const bin = process.env.IM_SERVER_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(repoRoot, "target"), "debug", "im-server");
  if (!existsSync(bin)) {
    throw new Error(
      `im-server binary not found at ${bin}: build it first (cargo build -p im-server) or set IM_SERVER_BIN to its path`,
    );
  }
  return bin;
}

function b64url(s: string | Buffer): string {
  return Buffer.from(s).toString("base64url");
}

/**
 * An HS256 JWT for `user` (claims sub, iat, exp) signed with {@link SECRET}.
 * @param user - the user id. @param ttlSecs - seconds until exp.
 */
export function mintToken(user: string, ttlSecs = 3600): string {
  const now = Math.floor(Date.now() / 1000);
  const head = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const body = b64url(JSON.stringify({ sub: user, iat: now, exp: now + ttlSecs }));
  const sig = createHmac("sha256", SECRET).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${sig}`;
}

/** A running im-server child process. */
export class TestServer {
  /** Client listener `host:port`. */
  clientAddr = "";
  /** Admin listener `host:port`. */
  adminAddr = "";
  /** Everything the server wrote to stderr. */
  log = "";
  private child: ChildProcess | undefined;

  private constructor(
    private readonly dataDir: string,
    private readonly env: Record<string, string>,
  ) {}

  /** Starts a server with extra IM_* settings. @param env - e.g. `{IM_LIMITS_SEND_RATE_PER_SEC: "5"}`. */
  static async start(env: Record<string, string> = {}): Promise<TestServer> {
    const s = new TestServer(mkdtempSync(join(tmpdir(), "im-sdk-e2e-")), env);
    await s.spawn("127.0.0.1:0");
    return s;
  }

  private spawn(listen: string): Promise<void> {
    const child = spawn(serverBin(), [], {
      env: {
        ...process.env,
        IM_LISTEN: listen,
        IM_ADMIN_LISTEN: "127.0.0.1:0",
        IM_DATA_DIR: this.dataDir,
        IM_JWT_SECRET: SECRET,
        IM_ADMIN_TOKEN: ADMIN_TOKEN,
        IM_LOG: "info",
        ...this.env,
      },
      stdio: ["ignore", "ignore", "pipe"],
    });
    this.child = child;
    return new Promise((resolveStart, reject) => {
      const timer = setTimeout(() => reject(new Error(`server did not start:\n${this.log}`)), WAIT_MS);
      child.stderr?.setEncoding("utf8");
      child.stderr?.on("data", (d: string) => {
        this.log += d;
        const m = /listening client=(\S+) admin=(\S+)/.exec(this.log);
        if (m && m[1] && m[2] && !this.clientAddr) {
          this.clientAddr = m[1];
          this.adminAddr = m[2];
          clearTimeout(timer);
          resolveStart();
        }
      });
      child.on("exit", (code, sig) => {
        clearTimeout(timer);
        reject(new Error(`server exited (${code ?? sig}) before listening:\n${this.log}`));
      });
    });
  }

  /** The WebSocket URL. */
  get url(): string {
    return `ws://${this.clientAddr}/ws`;
  }

  /** SIGKILLs the server and waits for it to go. */
  async kill(): Promise<void> {
    const c = this.child;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    const gone = new Promise((r) => c.once("exit", r));
    c.kill("SIGKILL");
    await gone;
  }

  /** Sends a signal (SIGSTOP/SIGCONT to freeze the server). @param sig - the signal. */
  signal(sig: NodeJS.Signals): void {
    this.child?.kill(sig);
  }

  /** Starts a new process on the same client port and data dir (after a kill). */
  async restart(): Promise<void> {
    await this.kill();
    const listen = this.clientAddr;
    this.clientAddr = "";
    this.log = "";
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      try {
        await this.spawn(listen);
        return;
      } catch (e) {
        // The port may linger briefly after the kill.
        if (Date.now() > deadline) throw e;
        await sleep(200);
      }
    }
  }

  /** Kills the server and removes its data dir. */
  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  /**
   * Calls the admin API. @param method - HTTP method. @param path - e.g. `/admin/v1/...`.
   * @param body - JSON body.
   */
  async admin(method: string, path: string, body?: unknown): Promise<Response> {
    const init: RequestInit = { method, headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" } };
    if (body !== undefined) init.body = JSON.stringify(body);
    return fetch(`http://${this.adminAddr}${path}`, init);
  }
}

/** Resolves after `ms`. @param ms - milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Waits until `cond()` is true (polling), or fails naming `what`.
 * @param what - the condition, for the failure. @param cond - the check. @param ms - limit.
 */
export async function waitFor(what: string, cond: () => boolean, ms = WAIT_MS): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

/** A client plus everything it received, for assertions. */
export interface TestClient {
  /** The SDK client. */
  client: Client;
  /** Messages received, in order. */
  messages: Message[];
  /** Every event name in order (state changes etc.). */
  events: Array<{ name: string; payload: unknown }>;
}

/**
 * A connected SDK client for `user` against `server`.
 * @param server - the server. @param user - the user id. @param opts - more options.
 */
export async function connectUser(server: TestServer, user: string, opts: Partial<ClientOptions> = {}): Promise<TestClient> {
  const tc = makeUser(server, user, opts);
  await tc.client.connect();
  return tc;
}

/**
 * An SDK client for `user`, not yet connected, recording its events.
 * @param server - the server. @param user - the user id. @param opts - more options.
 */
export function makeUser(server: TestServer, user: string, opts: Partial<ClientOptions> = {}): TestClient {
  const client = new Client({
    url: server.url,
    token: mintToken(user),
    webSocket: NodeWebSocket,
    reconnectMinMs: 50,
    reconnectMaxMs: 1000,
    ...opts,
  });
  const tc: TestClient = { client, messages: [], events: [] };
  client.on("message", (m) => tc.messages.push(m));
  for (const name of ["connecting", "connected", "disconnected", "closed", "queued", "receipt", "presence", "typing", "acked", "sendFailed", "tokenRefreshed", "error"] as const) {
    client.on(name, (payload: unknown) => tc.events.push({ name, payload }));
  }
  return tc;
}

/** The texts of `msgs` in a conversation. @param msgs - messages. @param conv - conversation id. */
export function texts(msgs: Message[], conv?: string): string[] {
  return msgs.filter((m) => conv === undefined || m.conversationId === conv).map((m) => m.text);
}
