import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { chooseUrl, RegionBook, REPROBE_AFTER_MS } from "../../src/route.js";

/** A `/v1/route` server answering `body` after `delayMs`. */
async function routeServer(delayMs: number, body: () => object): Promise<{ server: Server; url: string }> {
  const server = createServer((_req, res) => {
    setTimeout(() => {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(body()));
    }, delayMs);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

test("regions: probes each region, joins the nearest, fails over when it is lost", async () => {
  const regions: { name: string; route_url: string }[] = [];
  const far = await routeServer(80, () => ({ node_id: "a0", ws_url: "ws://far/ws", region: "a", regions }));
  const near = await routeServer(0, () => ({ node_id: "b0", ws_url: "ws://near/ws", region: "b", regions }));
  regions.push({ name: "a", route_url: far.url }, { name: "b", route_url: near.url });
  const book = new RegionBook();
  try {
    // The app knows only the far region; the SDK probes both and goes to the near one.
    const first = await chooseUrl(far.url, "ws://fallback/ws", undefined, 2000, book);
    assert.deepEqual(first, { url: "ws://near/ws", routed: true });
    assert.deepEqual(book.order().map((p) => p.name), ["b", "a"]);
    assert.ok(book.order().every((p) => p.rttMs !== undefined));
    // The near region is lost: the next nearest answers.
    near.server.closeAllConnections();
    await new Promise<void>((r) => near.server.close(() => r()));
    const second = await chooseUrl(far.url, "ws://fallback/ws", "b0", 2000, book);
    assert.deepEqual(second, { url: "ws://far/ws", routed: true });
    // A stale book is probed again: the lost region now sorts last.
    book.store(book.order(), Date.now() - REPROBE_AFTER_MS - 1);
    assert.equal(book.fresh(), undefined);
    const third = await chooseUrl(far.url, "ws://fallback/ws", undefined, 2000, book);
    assert.equal(third.url, "ws://far/ws");
    assert.deepEqual(book.order().map((p) => [p.name, p.rttMs === undefined]), [["a", false], ["b", true]]);
  } finally {
    far.server.closeAllConnections();
    far.server.close();
  }
});

test("regions: an answer without regions changes nothing", async () => {
  const one = await routeServer(0, () => ({ node_id: "n0", ws_url: "ws://one/ws" }));
  const book = new RegionBook();
  try {
    assert.deepEqual(await chooseUrl(one.url, "ws://fallback/ws", undefined, 2000, book), { url: "ws://one/ws", routed: true });
    assert.deepEqual(book.order(), []);
    const dead = await chooseUrl("http://127.0.0.1:1", "ws://fallback/ws", undefined, 2000, book);
    assert.equal(dead.url, "ws://fallback/ws");
    assert.equal(dead.routed, false);
    assert.match(dead.error ?? "", /route/);
  } finally {
    one.server.close();
  }
});
