// The web chat end to end: two users in two Chromium contexts against the real
// im-server, chatting both ways; one goes offline (DevTools network emulation) while the
// other sends, and sends itself; back online everything arrives once, in order, with
// read receipts; a reload pages history backwards by scrolling up.
import assert from "node:assert/strict";
import { test } from "node:test";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import {
  chromiumMissing,
  chromiumPath,
  mintToken,
  requireTools,
  screenshotDir,
  serveApp,
  serverBinMissing,
  skipUnlessTools,
  startImServer,
} from "./support.js";

const WAIT = { timeout: 15_000 };
const CONV = "u:alice:bob";

/** Everything one run needs, stopped in reverse. */
interface Env {
  browser: Browser;
  a: Page;
  b: Page;
  appUrl: string;
  wsUrl: string;
  stop: () => Promise<void>;
}

async function startEnv(): Promise<Env> {
  const server = await startImServer();
  const app = await serveApp().catch(async (e: unknown) => {
    await server.stop();
    throw e;
  });
  const stopServers = async (): Promise<void> => {
    await app.stop();
    await server.stop();
  };
  let browser: Browser;
  try {
    browser = await puppeteer.launch({
      executablePath: chromiumPath(),
      headless: true,
      args: ["--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,700"],
      defaultViewport: { width: 1000, height: 700 },
    });
  } catch (e) {
    await stopServers();
    throw e;
  }
  const stop = async (): Promise<void> => {
    await browser.close().catch(() => undefined);
    await stopServers();
  };
  try {
    const a = await newPage(browser, "alice");
    const b = await newPage(browser, "bob");
    return { browser, a, b, appUrl: app.url, wsUrl: server.wsUrl, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** Uncaught errors of the app's pages (the test ends asserting there were none). */
const pageErrors: string[] = [];

/** A page in a browser context of its own (its own storage), its uncaught errors kept. */
async function newPage(browser: Browser, name: string): Promise<Page> {
  const p = await (await browser.createBrowserContext()).newPage();
  watchErrors(p, name);
  return p;
}

function watchErrors(p: Page, name: string): void {
  p.on("pageerror", (e) => pageErrors.push(`${name}: ${e instanceof Error ? e.message : String(e)}`));
}

async function fillSignIn(p: Page, env: Env, token: string, wsUrl = env.wsUrl): Promise<void> {
  await p.goto(env.appUrl);
  await p.waitForSelector("#signin-form", { visible: true, ...WAIT });
  await p.$eval("#signin-url", (e, url) => ((e as HTMLInputElement).value = url), wsUrl);
  await p.$eval("#signin-token", (e, t) => ((e as HTMLTextAreaElement).value = t), token);
  await p.click("#signin-form button[type=submit]");
}

async function signIn(p: Page, env: Env, user: string): Promise<void> {
  await fillSignIn(p, env, mintToken(user));
  await waitOnline(p);
}

async function waitOnline(p: Page): Promise<void> {
  await p.waitForFunction(() => document.querySelector("#status")?.textContent === "online", WAIT);
}

/** Reloads the page and waits until the new document is signed in again (from sessionStorage). */
async function reloadOnline(p: Page): Promise<void> {
  await p.evaluate(() => ((window as { beforeReload?: boolean }).beforeReload = true));
  await p.reload();
  await p.waitForFunction(
    () => !(window as { beforeReload?: boolean }).beforeReload && document.querySelector("#status")?.textContent === "online",
    WAIT,
  );
}

async function send(p: Page, text: string): Promise<void> {
  await p.$eval("#composer-text", (e, t) => ((e as HTMLInputElement).value = t), text);
  await p.click("#composer button[type=submit]");
}

/** The texts of the shown messages, in screen order. */
function texts(p: Page): Promise<string[]> {
  return p.$$eval("#messages .msg .text", (els) => els.map((e) => e.textContent ?? ""));
}

/** The delivery state under our own message with this text ("sending…", "sent", "read"). */
function delivery(p: Page, text: string): Promise<string[]> {
  return p.$$eval(
    "#messages .msg.mine",
    (els, t) => els.filter((e) => e.querySelector(".text")?.textContent === t).map((e) => e.querySelector(".delivery")?.textContent ?? ""),
    text,
  );
}

async function waitDelivery(p: Page, text: string, state: string): Promise<void> {
  await p.waitForFunction(
    (t, s) =>
      [...document.querySelectorAll("#messages .msg.mine")].some(
        (e) => e.querySelector(".text")?.textContent === t && e.querySelector(".delivery")?.textContent === s,
      ),
    WAIT,
    text,
    state,
  );
}

async function waitText(p: Page, text: string): Promise<void> {
  await p.waitForFunction(
    (t) => [...document.querySelectorAll("#messages .msg .text")].some((e) => e.textContent === t),
    WAIT,
    text,
  );
}

function range(prefix: string, n: number): string[] {
  return Array.from({ length: n }, (_, i) => `${prefix}-${i + 1}`);
}

/** Runs `fn`; on failure keeps screenshots of both pages and prints where. */
async function withShots(env: Env, name: string, fn: () => Promise<void>): Promise<void> {
  try {
    await fn();
  } catch (e) {
    const dir = await screenshotDir(name);
    await env.a.screenshot({ path: `${dir}/alice.png` }).catch(() => undefined);
    await env.b.screenshot({ path: `${dir}/bob.png` }).catch(() => undefined);
    console.log(`screenshots of the failure: ${dir}`);
    throw e;
  }
}

/** With KEEP_SCREENSHOTS set, keeps screenshots of both pages as they are now. */
async function keepShots(env: Env, name: string): Promise<void> {
  if (!process.env.KEEP_SCREENSHOTS) return;
  const dir = await screenshotDir(`web-chat-${name}`);
  await env.a.screenshot({ path: `${dir}/alice.png` });
  await env.b.screenshot({ path: `${dir}/bob.png` });
  console.log(`screenshots (${name}): ${dir}`);
}

const missing = [chromiumMissing(), serverBinMissing()];

const options = { ...skipUnlessTools(...missing), timeout: 180_000 };

test("two users chat through the real server, offline and back, and page history", options, async (t) => {
  requireTools(...missing);
  const env = await startEnv();
  t.after(() => env.stop());
  await withShots(env, "web-chat-e2e", async () => {
    await chatBothWays(env);
    await offlineAndBack(env);
    await pageHistory(env);
    await keepShots(env, "working");
    await outboxSurvivesClosedTab(env);
    assert.deepEqual(pageErrors, [], "no uncaught errors in the pages");
  });
});

const HOSTILE = `hello bob <img src=x onerror="window.pwned=1"><b>not bold</b> & "quotes"`;

async function chatBothWays({ a, b, ...env }: Env): Promise<void> {
  // A token the server refuses brings the form back with the reason, and is not kept.
  await fillSignIn(a, { a, b, ...env }, mintToken("alice", 3600, "another-secret-of-at-least-32-bytes!"));
  await a.waitForFunction(() => /Signed out/.test(document.querySelector("#signin-error")?.textContent ?? ""), WAIT);
  assert.equal(await a.evaluate(() => sessionStorage.length), 0);
  // A server that does not answer: the app says so while the SDK keeps trying.
  await fillSignIn(b, { a, b, ...env }, mintToken("bob"), "ws://127.0.0.1:9/ws");
  await b.waitForFunction(() => /Cannot connect/.test(document.querySelector("#notice")?.textContent ?? ""), WAIT);
  assert.equal(await b.$eval("#status", (e) => e.textContent), "connecting");
  await b.click("#signout");
  await signIn(a, { a, b, ...env }, "alice");
  await signIn(b, { a, b, ...env }, "bob");
  // The tab remembers its sign-in: a reload comes back signed in.
  await reloadOnline(a);

  await a.type("#new-chat-user", "bob");
  await a.click("#new-chat button[type=submit]");
  await send(a, HOSTILE);
  await waitDelivery(a, HOSTILE, "sent");

  // Bob's list shows the new conversation live, with its unread count.
  await b.waitForFunction((id) => document.querySelector(`li[data-id="${id}"] .unread`)?.textContent === "1", WAIT, CONV);
  await b.click(`li[data-id="${CONV}"]`);
  await waitText(b, HOSTILE);
  assert.equal(await b.$$eval("#messages img, #messages b", (els) => els.length), 0, "message text is not markup");
  assert.equal(await b.evaluate(() => (window as { pwned?: number }).pwned), undefined);
  assert.equal(await b.$eval(`li[data-id="${CONV}"] .unread`, (e) => e.textContent), "", "read when viewed");

  // Bob viewed it: Alice sees "read"; Bob replies; Alice sees typing and presence.
  await waitDelivery(a, HOSTILE, "read");
  await b.type("#composer-text", "hi ali");
  await a.waitForFunction(() => document.querySelector("#typing")?.textContent === "bob is typing…", WAIT);
  await send(b, "hi alice");
  await waitText(a, "hi alice");
  await waitDelivery(b, "hi alice", "read");
  await a.waitForFunction(() => document.querySelector("#conv-dot")?.classList.contains("online"), WAIT);
}

async function offlineAndBack(env: Env): Promise<void> {
  const { a, b } = env;
  await b.setOfflineMode(true);
  // The emulation must really cut Bob's connection: banner, status, and Alice sees him go.
  await b.waitForSelector("#offline-banner", { visible: true, ...WAIT });
  assert.equal(await b.$eval("#status", (e) => e.textContent), "offline");
  await a.waitForFunction(() => !document.querySelector("#conv-dot")?.classList.contains("online"), WAIT);

  const fromAlice = range("offline", 20);
  for (const text of fromAlice) await send(a, text);
  for (const text of fromAlice) await waitDelivery(a, text, "sent");
  const fromBob = range("queued-by-bob", 2);
  for (const text of fromBob) await send(b, text);
  // Stored in the outbox (the SDK's `queued` event), not sent: the socket is cut.
  for (const text of fromBob) await waitDelivery(b, text, "saved");
  await keepShots(env, "offline");
  // Everything Alice sent is committed; give a live push time to (wrongly) arrive.
  await new Promise((ok) => setTimeout(ok, 1500));
  const seenOffline = await texts(b);
  assert.deepEqual(seenOffline.filter((x) => x.startsWith("offline-")), [], "nothing arrives while offline");
  assert.deepEqual((await texts(a)).filter((x) => x.startsWith("queued-by-bob")), []);
  for (const text of fromBob) assert.deepEqual(await delivery(b, text), ["saved"], "still unsent while offline");

  await b.setOfflineMode(false);
  await waitOnline(b);
  assert.equal(await b.$eval("#offline-banner", (e) => (e as HTMLElement).hidden), true);
  await waitText(b, "offline-20");
  for (const text of fromBob) await waitDelivery(b, text, "read");
  await waitText(a, "queued-by-bob-2");
  const expected = [HOSTILE, "hi alice", ...fromAlice, ...fromBob];
  assert.deepEqual(await texts(b), expected, "Bob sees each message once, in order");
  assert.deepEqual(await texts(a), expected, "Alice too");
  await waitDelivery(a, "offline-20", "read");
}

async function pageHistory({ a, b }: Env): Promise<void> {
  // A fresh page of Bob's tab (signed in again from sessionStorage), no conversation open.
  await reloadOnline(b);
  const more = range("later", 20);
  for (const text of more) await send(a, text);
  for (const text of more) await waitDelivery(a, text, "sent");
  const all = await texts(a);
  assert.equal(all.length, 44);
  await b.waitForFunction((id) => document.querySelector(`li[data-id="${id}"] .unread`)?.textContent === "20", WAIT, CONV);
  assert.equal(await b.title(), "(20) im web chat");

  // Opening the conversation shows the newest page, and marks it read: a real receipt
  // (Bob's read cursor was at his own last message, below these).
  await b.click(`li[data-id="${CONV}"]`);
  await waitText(b, "later-20");
  await waitDelivery(a, "later-20", "read");
  const first = await texts(b);
  assert.ok(first.length < all.length, `the first page is a page (${first.length} of ${all.length})`);
  assert.deepEqual(first, all.slice(all.length - first.length));

  // Scrolling up loads the older ones until none remain.
  await b.waitForFunction(() => {
    const pane = document.querySelector("#messages-pane");
    if (pane) pane.scrollTop = 0;
    return document.querySelector("#messages .msg .text")?.textContent?.startsWith("hello bob") ?? false;
  }, WAIT);
  assert.deepEqual(await texts(b), all, "history pages join without gaps or doubles");
  await b.waitForFunction(() => (document.querySelector("#load-older") as HTMLElement | null)?.hidden === true, WAIT);
}

async function outboxSurvivesClosedTab(env: Env): Promise<void> {
  const { a, b } = env;
  await b.setOfflineMode(true);
  await b.waitForSelector("#offline-banner", { visible: true, ...WAIT });
  await send(b, "kept-by-bob");
  // "saved" once the SDK says the outbox's IndexedDB holds it: closing the tab is safe.
  await waitDelivery(b, "kept-by-bob", "saved");
  // The tab closes with the message unsent; a new tab (online) signs in and resends it.
  const context = b.browserContext();
  await b.close();
  const b2 = await context.newPage();
  watchErrors(b2, "bob (new tab)");
  env.b = b2;
  await signIn(b2, env, "bob");
  await waitText(a, "kept-by-bob");
  await b2.click(`li[data-id="${CONV}"]`);
  await waitDelivery(b2, "kept-by-bob", "read");
  assert.equal((await texts(a)).filter((x) => x === "kept-by-bob").length, 1, "delivered once");
  assert.equal((await texts(b2)).filter((x) => x === "kept-by-bob").length, 1, "shown once");

  // Signing out forgets the tab's session and shows the form again, the URL kept.
  await a.click("#signout");
  await a.waitForSelector("#signin-form", { visible: true, ...WAIT });
  assert.equal(await a.evaluate(() => sessionStorage.length), 0);
  assert.equal(await a.$eval("#signin-url", (e) => (e as HTMLInputElement).value), env.wsUrl);
}
