import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { directConversationId, type Presence, type ReadReceipt, type Typing } from "../../src/index.js";
import { connectUser, TestServer, texts, waitFor } from "../support.js";

let server: TestServer;
before(async () => {
  server = await TestServer.start();
});
after(async () => {
  await server.stop();
});

const payloads = <T>(tc: { events: Array<{ name: string; payload: unknown }> }, name: string): T[] =>
  tc.events.filter((e) => e.name === name).map((e) => e.payload as T);

test("read receipts and the conversation list (unread, flags, paging)", async () => {
  const a = await connectUser(server, "ra");
  const b = await connectUser(server, "rb");
  const conv = directConversationId("ra", "rb");
  let last = 0;
  for (let i = 0; i < 3; i++) last = (await a.client.send({ to: "rb" }, `r${i}`)).seq;
  await waitFor("b has 3", () => b.messages.length === 3);
  const before = await b.client.listConversations();
  const entry = before.conversations.find((c) => c.conversationId === conv);
  assert.ok(entry, "the conversation is listed");
  assert.equal(entry.kind, "DIRECT");
  assert.equal(entry.name, "ra");
  assert.equal(entry.unread, 3);
  assert.equal(entry.lastMessage?.text, "r2");
  await b.client.markRead(conv, last);
  await waitFor("a got the receipt", () => payloads<ReadReceipt>(a, "receipt").some((r) => r.seq === last));
  assert.equal(payloads<ReadReceipt>(a, "receipt").at(-1)?.userId, "rb");
  await b.client.setConversationFlags(conv, { muted: true, pinned: true });
  const after1 = (await b.client.listConversations()).conversations.find((c) => c.conversationId === conv);
  assert.deepEqual([after1?.unread, after1?.muted, after1?.pinned, after1?.readSeq], [0, true, true, last]);
  // Paging: three conversations, one per page.
  await a.client.send({ to: "rc" }, "x");
  await a.client.send({ to: "rd" }, "y");
  const seen: string[] = [];
  let after = "";
  for (let i = 0; i < 5; i++) {
    const page = await a.client.listConversations({ after, limit: 1 });
    seen.push(...page.conversations.map((c) => c.conversationId));
    after = page.nextAfter;
    if (!after) break;
  }
  assert.equal(new Set(seen).size, 3);
  await a.client.close();
  await b.client.close();
});

test("history paging, recall, edit, delete-for-me", async () => {
  const a = await connectUser(server, "ha");
  const b = await connectUser(server, "hb");
  const conv = directConversationId("ha", "hb");
  const acks = [];
  for (let i = 0; i < 25; i++) acks.push(await a.client.send({ to: "hb" }, `h${i}`));
  // Pages of 10, newest first, until more = false.
  const got: string[] = [];
  let beforeSeq = 0;
  for (;;) {
    const page = await b.client.fetchHistory(conv, { beforeSeq, limit: 10 });
    got.push(...page.messages.map((m) => m.text));
    if (!page.more) break;
    beforeSeq = page.messages.at(-1)?.seq ?? 0;
  }
  assert.deepEqual(got, Array.from({ length: 25 }, (_, i) => `h${24 - i}`));

  const first = acks[0];
  const second = acks[1];
  const third = acks[2];
  assert.ok(first && second && third);
  const recall = await a.client.recall(conv, first.seq, first.msgId);
  const edit = await a.client.edit(conv, second.seq, second.msgId, "h1 edited");
  await waitFor("b got recall and edit events", () => b.messages.some((m) => m.seq === edit.seq));
  const rec = b.messages.find((m) => m.seq === recall.seq);
  assert.deepEqual([rec?.type, rec?.refSeq, rec?.refMsgId], ["RECALL", first.seq, first.msgId]);
  const ed = b.messages.find((m) => m.seq === edit.seq);
  assert.deepEqual([ed?.type, ed?.text, ed?.refSeq], ["EDIT", "h1 edited", second.seq]);
  await b.client.deleteForMe(conv, third.seq);
  const page = await b.client.fetchHistory(conv, { beforeSeq: third.seq + 1, limit: 3 });
  const bySeq = new Map(page.messages.map((m) => [m.seq, m]));
  assert.equal(bySeq.get(first.seq)?.state, "RECALLED");
  assert.equal(bySeq.get(second.seq)?.state, "EDITED");
  assert.equal(bySeq.get(second.seq)?.text, "h1 edited");
  assert.equal(bySeq.get(third.seq)?.state, "HIDDEN");
  // The sender still sees the third message.
  const mine = await a.client.fetchHistory(conv, { beforeSeq: third.seq + 1, limit: 1 });
  assert.equal(mine.messages[0]?.state, "ORIGINAL");
  await a.client.close();
  await b.client.close();
});

test("presence subscribe and hidden, typing throttled", async () => {
  const a = await connectUser(server, "pra");
  const b = await connectUser(server, "prb");
  await a.client.send({ to: "prb" }, "hi");
  await a.client.subscribePresence(["prb"]);
  await waitFor("b online", () => payloads<Presence>(a, "presence").some((p) => p.userId === "prb" && p.online));
  await b.client.setPresenceHidden(true);
  await waitFor("b shows offline", () => payloads<Presence>(a, "presence").at(-1)?.online === false);
  await b.client.setPresenceHidden(false);
  await waitFor("b online again", () => payloads<Presence>(a, "presence").at(-1)?.online === true);

  const conv = directConversationId("pra", "prb");
  assert.equal(await a.client.typing(conv, true), true);
  // Within the interval a second "typing" is throttled away; a stop goes at once.
  assert.equal(await a.client.typing(conv, true), false);
  assert.equal(await a.client.typing(conv, false), true);
  assert.equal(await a.client.typing(conv, false), false);
  await waitFor("b saw typing and the stop", () => payloads<Typing>(b, "typing").length >= 2);
  assert.deepEqual(payloads<Typing>(b, "typing").map((t) => [t.userId, t.typing]), [["pra", true], ["pra", false]]);
  await a.client.close();
  await b.client.close();
});

test("devices: per-device cursors, a send from one device reaches the other", async () => {
  const phone = await connectUser(server, "dva", { deviceId: "phone" });
  const laptop = await connectUser(server, "dva", { deviceId: "laptop" });
  const bob = await connectUser(server, "dvb");
  const ack = await phone.client.send({ to: "dvb" }, "from the phone");
  await waitFor("laptop got the phone's message", () => laptop.messages.some((m) => m.msgId === ack.msgId));
  assert.ok(!phone.messages.some((m) => m.msgId === ack.msgId), "not echoed to the sending device");
  await bob.client.send({ to: "dva" }, "to both");
  await waitFor("both devices have it", () => phone.messages.length === 1 && laptop.messages.length === 2);
  await laptop.client.close();
  // Bob writes while the laptop is away; the laptop syncs from its own cursor.
  for (let i = 0; i < 5; i++) await bob.client.send({ to: "dva" }, `away${i}`);
  const laptop2 = await connectUser(server, "dva", { deviceId: "laptop" });
  await waitFor("laptop synced the 5", () => laptop2.messages.length === 5);
  assert.deepEqual(texts(laptop2.messages), ["away0", "away1", "away2", "away3", "away4"]);
  for (const c of [phone, laptop2, bob]) await c.client.close();
});
