import assert from "node:assert/strict";
import { test } from "node:test";
import { OutboxFullError, ServerError } from "../../src/errors.js";
import { Outbox, WINDOW_START } from "../../src/outbox.js";
import { MemoryOutboxStore, type OutboxEntry } from "../../src/store.js";
import type { SendAck } from "../../src/types.js";

const entry = (id: string, at = 0): OutboxEntry => ({
  op: "send",
  clientMsgId: id,
  target: { to: "bob" },
  type: "TEXT",
  payload: new Uint8Array([1]),
  createdAt: at,
});
const ack = (id: string, seq = 1): SendAck => ({
  clientMsgId: id,
  msgId: `m-${id}`,
  conversationId: "u:a:b",
  seq,
  serverTime: 0,
  duplicate: false,
});
const zero = (): number => 0;

test("bounded: refuses with OutboxFullError when full, room again after an ack", async () => {
  const o = new Outbox(2, undefined, zero);
  const p1 = o.add(entry("1"));
  o.add(entry("2")).catch(() => undefined);
  assert.throws(() => o.add(entry("3")), (e: unknown) => e instanceof OutboxFullError && e.max === 2);
  assert.deepEqual(o.take(0).map((e) => e.clientMsgId), ["1", "2"]);
  assert.equal(o.acked(ack("1")), true);
  assert.equal((await p1).msgId, "m-1");
  o.add(entry("3")).catch(() => undefined);
  assert.equal(o.size, 2);
});

test("the same client_msg_id queued twice is one entry", async () => {
  const o = new Outbox(5, undefined, zero);
  const a = o.add(entry("x"));
  const b = o.add(entry("x"));
  assert.equal(o.size, 1);
  o.take(0);
  o.acked(ack("x"));
  assert.deepEqual([(await a).msgId, (await b).msgId], ["m-x", "m-x"]);
});

test("window: at most WINDOW_START in flight; a disconnect puts them back, oldest first", () => {
  const o = new Outbox(1000, undefined, zero);
  for (let i = 0; i < 100; i++) o.add(entry(String(i))).catch(() => undefined);
  assert.equal(o.take(0).length, WINDOW_START);
  assert.equal(o.take(0).length, 0);
  o.disconnected();
  assert.deepEqual(o.take(0).slice(0, 3).map((e) => e.clientMsgId), ["0", "1", "2"]);
});

test("RATE_LIMITED: kept, paused for retry_after_ms, then paced one at a time", () => {
  const o = new Outbox(10, undefined, zero);
  for (let i = 0; i < 5; i++) o.add(entry(String(i))).catch(() => undefined);
  o.take(1000);
  assert.equal(o.refused("3", new ServerError("RATE_LIMITED", "slow down", 40), 1000), "retry");
  assert.equal(o.size, 5);
  assert.equal(o.pausedFor(1000), 40);
  assert.deepEqual(o.take(1010), []);
  assert.equal(o.pace, 50);
  assert.deepEqual(o.take(1040).map((e) => e.clientMsgId), ["3"]);
  assert.deepEqual(o.take(1041), [], "paced: one per interval");
  assert.equal(o.refused("4", new ServerError("RATE_LIMITED", "slow down", 10), 1041), "retry");
  assert.equal(o.pausedFor(1041), 49, "the pacer's next slot, not the shorter new hint");
  o.acked(ack("3"));
  assert.ok(o.pace < 50, "each ack speeds the pacer up");
});

test("other refusals fail the entry for good with the server's error", async () => {
  const o = new Outbox(10, undefined, zero);
  const p = o.add(entry("f"));
  o.take(0);
  assert.equal(o.refused("f", new ServerError("FORBIDDEN", "no", 0), 0), "failed");
  await assert.rejects(p, (e: unknown) => e instanceof ServerError && e.code === "FORBIDDEN");
  assert.equal(o.size, 0);
  assert.equal(o.refused("nope", new ServerError("FORBIDDEN", "no", 0), 0), "unknown");
});

test("restore takes back stored entries up to the bound; the memory store keeps order", async () => {
  const store = new MemoryOutboxStore();
  await store.put(entry("b", 2));
  await store.put(entry("a", 1));
  await store.put(entry("c", 3));
  const o = new Outbox(2, store, zero);
  o.restore(await store.load());
  assert.deepEqual(o.take(0).map((e) => e.clientMsgId), ["a", "b"]);
  await store.delete("a");
  assert.deepEqual((await store.load()).map((e) => e.clientMsgId), ["b", "c"]);
});
