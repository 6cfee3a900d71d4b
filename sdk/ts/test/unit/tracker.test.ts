import assert from "node:assert/strict";
import { test } from "node:test";
import { SeqTracker } from "../../src/tracker.js";
import type { Message } from "../../src/types.js";

const m = (conversationId: string, seq: number): Message => ({
  conversationId,
  seq,
  sender: "x",
  payload: new Uint8Array(),
  text: String(seq),
  sendTime: 0,
  type: "TEXT",
  msgId: `m${seq}`,
  clientMsgId: "",
  refSeq: 0,
  refMsgId: "",
  state: "ORIGINAL",
  editTime: 0,
});
const seqs = (ms: Message[]): number[] => ms.map((x) => x.seq);

test("in order: each seq once, duplicates dropped and re-acked", () => {
  const t = new SeqTracker();
  assert.deepEqual(seqs(t.arrive(m("c", 1)).ready), [1]);
  assert.deepEqual(seqs(t.arrive(m("c", 2)).ready), [2]);
  assert.deepEqual(t.takeAcks(), [["c", 2]]);
  assert.deepEqual(t.arrive(m("c", 2)), { ready: [], gap: false });
  assert.deepEqual(t.takeAcks(), [["c", 2]], "a duplicate means the server's cursor lags: ack again");
  assert.deepEqual(t.takeAcks(), []);
});

test("a gap holds later seqs until the hole fills, then releases them in order", () => {
  const t = new SeqTracker();
  t.arrive(m("c", 1));
  const a3 = t.arrive(m("c", 3));
  assert.deepEqual(a3, { ready: [], gap: true });
  assert.equal(t.arrive(m("c", 4)).gap, true);
  assert.deepEqual(t.holes(), [["c", 1, 4]]);
  assert.deepEqual(seqs(t.arrive(m("c", 2)).ready), [2, 3, 4]);
  assert.equal(t.hasHeld(), false);
  assert.equal(t.delivered("c"), 4);
});

test("own sends take their place without being emitted", () => {
  const t = new SeqTracker();
  t.arrive(m("c", 1));
  assert.equal(t.arrive(m("c", 3)).gap, true);
  assert.deepEqual(seqs(t.own("c", 2).ready), [3]);
  assert.equal(t.delivered("c"), 3);
  assert.deepEqual(t.own("c", 4), { ready: [], gap: false });
  assert.equal(t.delivered("c"), 4);
});

test("settle releases held seqs up to a bound and never moves back", () => {
  const t = new SeqTracker();
  t.arrive(m("c", 5));
  t.arrive(m("c", 7));
  assert.deepEqual(seqs(t.settle("c", 5)), [5]);
  assert.equal(t.delivered("c"), 5);
  assert.deepEqual(seqs(t.settle("c", 6)), [7]);
  assert.deepEqual(t.settle("c", 3), []);
  assert.equal(t.delivered("c"), 7);
});

test("conversations are independent; seq 0 passes straight through", () => {
  const t = new SeqTracker();
  t.arrive(m("a", 1));
  assert.equal(t.arrive(m("b", 2)).gap, true);
  assert.deepEqual(seqs(t.arrive(m("a", 2)).ready), [2]);
  assert.deepEqual(seqs(t.arrive(m("z", 0)).ready), [0]);
  assert.deepEqual(t.holes(), [["b", 0, 2]]);
});
