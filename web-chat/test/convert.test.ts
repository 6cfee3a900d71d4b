// Unit tests of how SDK messages become the app's: text, kinds shown as placeholders,
// events (recall, edit) and hidden messages left out.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { Message } from "im-sdk";
import { incoming, messageText } from "../src/convert.js";

function message(over: Partial<Message>): Message {
  return {
    conversationId: "u:alice:bob",
    sender: "bob",
    payload: new Uint8Array(),
    text: "hello",
    sendTime: 1000,
    type: "TEXT",
    seq: 7,
    msgId: "m7",
    clientMsgId: "c7",
    refSeq: 0,
    refMsgId: "",
    state: "ORIGINAL",
    editTime: 0,
    ...over,
  };
}

test("a text message keeps its text, seq, sender, time and client id", () => {
  assert.deepEqual(incoming(message({})), {
    conversationId: "u:alice:bob",
    seq: 7,
    sender: "bob",
    text: "hello",
    time: 1000,
    clientMsgId: "c7",
  });
});

test("other kinds show a placeholder; recall and edit events, recalled and hidden messages are not shown", () => {
  assert.equal(messageText(message({ type: "IMAGE" })), "[image]");
  assert.equal(messageText(message({ type: "FILE" })), "[file]");
  assert.equal(incoming(message({ type: "RECALL" })), null);
  assert.equal(incoming(message({ type: "EDIT" })), null);
  assert.equal(incoming(message({ state: "RECALLED" })), null);
  assert.equal(incoming(message({ state: "HIDDEN" })), null);
  assert.equal(incoming(message({ state: "EDITED", text: "new" }))?.text, "new");
});

test("a group event reads as a sentence", () => {
  const m = message({
    type: "SYSTEM",
    sender: "",
    groupEvent: { op: "ADD", actor: "alice", users: ["bob", "carol"], count: 2, role: "NONE", kind: "PRIVATE" },
  });
  assert.equal(messageText(m), "alice added bob, carol");
  const many = message({
    type: "SYSTEM",
    groupEvent: { op: "SET_ROLE", actor: "alice", users: ["bob"], count: 3, role: "ADMIN", kind: "PRIVATE" },
  });
  assert.equal(messageText(many), "alice made bob and 2 more admin");
});
