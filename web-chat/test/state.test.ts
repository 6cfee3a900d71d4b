// Unit tests of the app state: messages inserted once in seq order, pending sends
// marked stored then replaced by their ack, unread counting, receipts, typing and
// history paging marks.
import assert from "node:assert/strict";
import { test } from "node:test";
import { type IncomingMsg, type State, initialState, lastStoredSeq, oldestSeq, peerOf, reduce } from "../src/state.js";

const CONV = "u:alice:bob";

function signedIn(me = "alice"): State {
  const s = initialState();
  reduce(s, { type: "signing-in", serverUrl: "ws://x/ws", me });
  reduce(s, { type: "status", status: "online" });
  return s;
}

function msg(seq: number, sender = "bob", clientMsgId = ""): IncomingMsg {
  return { conversationId: CONV, seq, sender, text: `m${seq}`, time: seq * 1000, clientMsgId };
}

function seqs(s: State, id = CONV): number[] {
  return s.conversations.get(id)?.messages.map((m) => m.seq) ?? [];
}

test("peerOf reads the other party of a direct conversation", () => {
  assert.equal(peerOf("u:alice:bob", "alice"), "bob");
  assert.equal(peerOf("u:alice:bob", "bob"), "alice");
  assert.equal(peerOf("g:team", "alice"), null);
});

test("messages are kept once each, in seq order, whatever order they come in", () => {
  const s = signedIn();
  reduce(s, { type: "messages", list: [msg(3), msg(1)] });
  reduce(s, { type: "messages", list: [msg(2), msg(3)] });
  reduce(s, { type: "history", conversationId: CONV, list: [msg(3), msg(2), msg(1)], more: false });
  assert.deepEqual(seqs(s), [1, 2, 3]);
  assert.equal(s.conversations.get(CONV)?.lastText, "m3");
});

test("unread counts others' new messages outside the open conversation only", () => {
  const s = signedIn();
  reduce(s, { type: "summaries", list: [{ id: CONV, kind: "direct", name: "bob", unread: 2, lastSeq: 2, lastText: "m2", lastTime: 2000, peerReadSeq: 0 }] });
  reduce(s, { type: "messages", list: [msg(2), msg(3), msg(4, "alice")] });
  assert.equal(s.conversations.get(CONV)?.unread, 3, "seq 2 was counted by the list; 4 is ours");
  reduce(s, { type: "select", conversationId: CONV });
  assert.equal(s.conversations.get(CONV)?.unread, 0);
  reduce(s, { type: "messages", list: [msg(5)] });
  assert.equal(s.conversations.get(CONV)?.unread, 0);
});

test("a pending send shows until its ack, then sits at its seq", () => {
  const s = signedIn();
  reduce(s, { type: "messages", list: [msg(1)] });
  reduce(s, { type: "queued", conversationId: CONV, clientMsgId: "c1", text: "hello", time: 5 });
  reduce(s, { type: "queued", conversationId: CONV, clientMsgId: "c1", text: "hello", time: 5 });
  const c = s.conversations.get(CONV);
  assert.deepEqual(c?.messages.map((m) => [m.seq, m.pending]), [[1, false], [0, true]]);
  reduce(s, { type: "messages", list: [msg(3)] });
  reduce(s, { type: "acked", conversationId: CONV, clientMsgId: "c1", seq: 2, time: 6 });
  assert.deepEqual(c?.messages.map((m) => [m.seq, m.text, m.pending]), [[1, "m1", false], [2, "hello", false], [3, "m3", false]]);
  // The same message again from history (it carries the client_msg_id) is not doubled.
  reduce(s, { type: "history", conversationId: CONV, list: [msg(2, "alice", "c1")], more: false });
  assert.deepEqual(seqs(s), [1, 2, 3]);
});

test("a pending send is marked stored once the outbox holds it, and not after its ack", () => {
  const s = signedIn();
  reduce(s, { type: "queued", conversationId: CONV, clientMsgId: "c1", text: "a", time: 1 });
  reduce(s, { type: "queued", conversationId: CONV, clientMsgId: "c2", text: "b", time: 2, stored: true });
  const c = s.conversations.get(CONV);
  assert.deepEqual(c?.messages.map((m) => [m.key, m.stored ?? false]), [["c1", false], ["c2", true]]);
  reduce(s, { type: "stored", clientMsgId: "c1" });
  assert.equal(c?.messages[0]?.stored, true);
  // The ack came first (a resend beat the store's write): the stored message stays sent.
  reduce(s, { type: "queued", conversationId: CONV, clientMsgId: "c3", text: "c", time: 3 });
  reduce(s, { type: "acked", conversationId: CONV, clientMsgId: "c3", seq: 7, time: 4 });
  reduce(s, { type: "stored", clientMsgId: "c3" });
  const m = c?.messages.find((x) => x.key === "c3");
  assert.deepEqual([m?.seq, m?.pending, m?.stored], [7, false, undefined]);
  reduce(s, { type: "stored", clientMsgId: "unknown" });
  assert.equal(c?.messages.length, 3);
});

test("an ack of a message never shown adds nothing; a refusal marks the message failed", () => {
  const s = signedIn();
  reduce(s, { type: "acked", conversationId: CONV, clientMsgId: "zz", seq: 9, time: 1 });
  assert.deepEqual(seqs(s), []);
  reduce(s, { type: "queued", conversationId: CONV, clientMsgId: "c2", text: "x", time: 1 });
  reduce(s, { type: "send-failed", clientMsgId: "c2", reason: "FORBIDDEN: no" });
  const m = s.conversations.get(CONV)?.messages[0];
  assert.equal(m?.pending, false);
  assert.equal(m?.failed, "FORBIDDEN: no");
  assert.match(s.notice, /FORBIDDEN/);
});

test("receipts move the peer's read mark forward only, and ignore our own", () => {
  const s = signedIn();
  reduce(s, { type: "messages", list: [msg(2, "bob"), msg(4, "alice")] });
  assert.equal(s.conversations.get(CONV)?.peerReadSeq, 2, "a peer's own message counts as read by them");
  reduce(s, { type: "receipt", conversationId: CONV, userId: "bob", seq: 5 });
  reduce(s, { type: "receipt", conversationId: CONV, userId: "bob", seq: 3 });
  reduce(s, { type: "receipt", conversationId: CONV, userId: "alice", seq: 9 });
  assert.equal(s.conversations.get(CONV)?.peerReadSeq, 5);
});

test("history pages record whether older messages remain and where the oldest is", () => {
  const s = signedIn();
  reduce(s, { type: "history-loading", conversationId: CONV });
  assert.equal(s.conversations.get(CONV)?.loadingOlder, true);
  reduce(s, { type: "history", conversationId: CONV, list: [msg(12), msg(11), msg(10)], more: true });
  const c = s.conversations.get(CONV);
  assert.ok(c);
  assert.equal(c.loadingOlder, false);
  assert.equal(c.hasOlder, true);
  assert.equal(oldestSeq(c), 10);
  assert.equal(lastStoredSeq(c), 12);
  reduce(s, { type: "history", conversationId: CONV, list: [msg(9)], more: false });
  assert.equal(c.hasOlder, false);
  assert.deepEqual(seqs(s), [9, 10, 11, 12]);
});

test("typing shows for others only, and stops on a stop", () => {
  const s = signedIn();
  reduce(s, { type: "typing", conversationId: CONV, userId: "alice", typing: true, now: 1 });
  assert.equal(s.conversations.get(CONV)?.typing ?? null, null);
  reduce(s, { type: "typing", conversationId: CONV, userId: "bob", typing: true, now: 1 });
  assert.equal(s.conversations.get(CONV)?.typing?.user, "bob");
  reduce(s, { type: "typing", conversationId: CONV, userId: "bob", typing: false, now: 2 });
  assert.equal(s.conversations.get(CONV)?.typing, null);
  reduce(s, { type: "typing", conversationId: CONV, userId: "bob", typing: true, now: 3 });
  reduce(s, { type: "messages", list: [msg(1, "bob")] });
  assert.equal(s.conversations.get(CONV)?.typing, null, "their message ends their typing");
});

test("presence is forgotten when the connection drops; sign-out keeps the server URL", () => {
  const s = signedIn();
  reduce(s, { type: "presence", userId: "bob", online: true });
  assert.ok(s.online.has("bob"));
  reduce(s, { type: "status", status: "offline" });
  assert.equal(s.online.size, 0);
  reduce(s, { type: "signed-out", notice: "bye" });
  assert.equal(s.status, "signed-out");
  assert.equal(s.serverUrl, "ws://x/ws");
  assert.equal(s.conversations.size, 0);
});
