// Test helpers of the web chat, in one place: finding the tools a browser test needs
// (Chromium, the im-server binary) with the skip-or-fail rule, starting a real im-server
// on free ports with a temp data dir, minting its HS256 tokens, serving the built app,
// and keeping screenshots of failures.
import { spawn, type ChildProcess } from "node:child_process";
import { createHmac } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { startStatic } from "../scripts/serve.mjs";

/** web-chat's folder (tests are bundled one level below it, into test-build/). */
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
/** The JWT secret the test servers are started with. */
export const SECRET = "web-chat-test-secret-of-at-least-32-bytes";

/** Why a tool is missing, or null when it is there. */
export type Missing = string | null;

/**
 * The test-runner option for a test that needs tools: skipped with the reason when a tool
 * is missing and CI is unset; when CI is set the test runs and `requireTools` fails it.
 */
export function skipUnlessTools(...missing: Missing[]): { skip?: string } {
  const reason = missing.filter((m): m is string => m !== null).join("; ");
  if (!reason || process.env.CI) return {};
  console.log(`skipping browser test: ${reason}`);
  return { skip: reason };
}

/** Throws when a tool is missing (the test runs only then under CI). */
export function requireTools(...missing: Missing[]): void {
  const reason = missing.filter((m): m is string => m !== null).join("; ");
  if (reason) throw new Error(`CI is set and a tool is missing: ${reason}`);
}

/** The Chromium binary: CHROMIUM_BIN, else Debian's /usr/bin/chromium. */
export function chromiumPath(): string {
  return process.env.CHROMIUM_BIN ?? "/usr/bin/chromium";
}

/** Null when Chromium is installed, else why not. */
export function chromiumMissing(): Missing {
  const p = chromiumPath();
  return existsSync(p) ? null : `chromium not found at ${p} (apt-get install chromium)`;
}

/** The im-server binary: IM_SERVER_BIN, else ${CARGO_TARGET_DIR:-<repo>/target}/debug/im-server. */
export function serverBinPath(): string {
  if (process.env.IM_SERVER_BIN) return process.env.IM_SERVER_BIN;
  const target = process.env.CARGO_TARGET_DIR ?? join(ROOT, "..", "target");
  return join(target, "debug", "im-server");
}

/** Null when the im-server binary exists, else why not. */
export function serverBinMissing(): Missing {
  const p = serverBinPath();
  return existsSync(p) ? null : `im-server not found at ${p} (cargo build -p im-server, or set IM_SERVER_BIN)`;
}

function b64url(data: string | Buffer): string {
  return Buffer.from(data).toString("base64url");
}

/** An HS256 JWT for `user` (claims sub, iat, exp) signed with `secret`. */
export function mintToken(user: string, ttlSecs = 3600, secret = SECRET): string {
  const now = Math.floor(Date.now() / 1000);
  const head = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const body = b64url(JSON.stringify({ sub: user, iat: now, exp: now + ttlSecs }));
  const sig = createHmac("sha256", secret).update(`${head}.${body}`).digest();
  return `${head}.${body}.${b64url(sig)}`;
}

/** A running im-server: its WebSocket URL, and how to stop it. */
export interface ImServer {
  wsUrl: string;
  adminUrl: string;
  log: () => string;
  stop: () => Promise<void>;
}

function waitListening(child: ChildProcess, lines: string[]): Promise<string> {
  return new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`im-server did not start:\n${lines.join("\n")}`)), 30_000);
    child.once("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`im-server exited ${code}:\n${lines.join("\n")}`));
    });
    createInterface({ input: child.stderr! }).on("line", (line) => {
      lines.push(line);
      if (line.includes("listening client=")) {
        clearTimeout(timer);
        ok(line);
      }
    });
  });
}

/** Starts the real im-server on free ports with a fresh data dir. */
export async function startImServer(): Promise<ImServer> {
  const dir = await mkdtemp(join(tmpdir(), "web-chat-im-"));
  const child = spawn(serverBinPath(), [], {
    env: {
      ...process.env,
      IM_LISTEN: "127.0.0.1:0",
      IM_ADMIN_LISTEN: "127.0.0.1:0",
      IM_DATA_DIR: join(dir, "data"),
      IM_JWT_SECRET: SECRET,
      IM_ADMIN_TOKEN: "web-chat-admin-token-of-at-least-32-bytes",
      IM_LOG: "info",
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const lines: string[] = [];
  const line = await waitListening(child, lines);
  const addr = (key: string): string => {
    const m = new RegExp(`${key}=(\\S+)`).exec(line);
    if (!m?.[1]) throw new Error(`no ${key} address in: ${line}`);
    return m[1];
  };
  const stop = async (): Promise<void> => {
    if (child.exitCode === null) {
      const done = new Promise((ok) => child.once("exit", ok));
      child.kill("SIGKILL");
      await done;
    }
    await rm(dir, { recursive: true, force: true });
  };
  return { wsUrl: `ws://${addr("client")}/ws`, adminUrl: `http://${addr("admin")}`, log: () => lines.join("\n"), stop };
}

/** Serves the built app (dist/) on a free port; resolves to its URL and a stop function. */
export async function serveApp(): Promise<{ url: string; stop: () => Promise<void> }> {
  const { server, url } = await startStatic({ root: join(ROOT, "dist"), port: 0 });
  const stop = (): Promise<void> =>
    new Promise((ok) => {
      server.closeAllConnections();
      server.close(() => ok());
    });
  return { url, stop };
}

/** A fresh folder for this run's failure screenshots, under test-output/. */
export async function screenshotDir(name: string): Promise<string> {
  const dir = join(ROOT, "test-output", `${name}-${new Date().toISOString().replace(/[:.]/g, "-")}`);
  await mkdir(dir, { recursive: true });
  return dir;
}
