import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, ConfigError, InvalidArgumentError } from "../../src/index.js";
import { checkConversation, checkPayload, validId } from "../../src/validate.js";
import { NodeWebSocket } from "../support.js";

const isArg = (name: string) => (e: unknown) => e instanceof InvalidArgumentError && e.argument.startsWith(name);

test("ids, conversations and payloads are checked like the server does", () => {
  assert.ok(validId("alice.b-c_d@x"));
  for (const bad of ["", "a:b", "a b", "x".repeat(65), "é", 5]) assert.equal(validId(bad), false, String(bad));
  assert.equal(checkConversation("u:a:b"), "u:a:b");
  assert.equal(checkConversation("g:team"), "g:team");
  for (const bad of ["u:a", "g:", "x:a", "g:a:b", "u:a:b c"]) assert.throws(() => checkConversation(bad), isArg("conversationId"));
  assert.throws(() => checkPayload("", 10), isArg("payload"));
  assert.throws(() => checkPayload("x".repeat(11), 10), isArg("payload"));
  assert.throws(() => checkPayload(42, 10), isArg("payload"));
  assert.deepEqual(checkPayload("hé", 10), new Uint8Array([104, 195, 169]));
});

test("bad options throw typed errors", () => {
  const ok = { url: "ws://127.0.0.1:1/ws", token: "t", webSocket: NodeWebSocket };
  assert.throws(() => new Client({ ...ok, url: "http://x/ws" }), isArg("url"));
  assert.throws(() => new Client({ ...ok, url: "not a url" }), isArg("url"));
  assert.throws(() => new Client({ ...ok, routeUrl: "ftp://x" }), isArg("routeUrl"));
  assert.throws(() => new Client({ url: ok.url, webSocket: NodeWebSocket }), isArg("token"));
  assert.throws(() => new Client({ ...ok, deviceId: "bad device" }), isArg("deviceId"));
  assert.throws(() => new Client({ ...ok, outboxMax: 0 }), isArg("outboxMax"));
  assert.throws(() => new Client({ url: ok.url, token: "t" }), (e: unknown) => e instanceof ConfigError);
});

test("bad arguments reject with InvalidArgumentError before anything is queued", async () => {
  const c = new Client({ url: "ws://127.0.0.1:1/ws", token: "t", webSocket: NodeWebSocket, maxPayloadBytes: 100 });
  await assert.rejects(c.send({ to: "bad id" }, "x"), isArg("target.to"));
  await assert.rejects(c.send({ to: "bob", group: "g" } as never, "x"), isArg("target"));
  await assert.rejects(c.send({ to: "bob" }, ""), isArg("payload"));
  await assert.rejects(c.send({ to: "bob" }, "x".repeat(101)), isArg("payload"));
  await assert.rejects(c.send({ to: "bob" }, "x", { type: "SYSTEM" }), isArg("type"));
  await assert.rejects(c.recall("u:a:b", 0, "m"), isArg("seq"));
  await assert.rejects(c.edit("nope", 1, "m", "x"), isArg("conversationId"));
  await assert.rejects(c.addMembers("g1", []), isArg("users"));
  await assert.rejects(c.addMembers("g1", ["ok", "no way"]), isArg("members[1]"));
  await assert.rejects(c.setRole("g1", ["u"], "OWNER" as never), isArg("role"));
  await assert.rejects(c.markRead("u:a:b", 1.5), isArg("seq"));
  await assert.rejects(c.fetchHistory("g:x", { limit: -1 }), isArg("limit"));
  await assert.rejects(c.typing("bad", true), isArg("conversationId"));
  await assert.rejects(c.subscribePresence(["a", ""]), isArg("users[1]"));
  assert.equal(c.pendingSends, 0);
  assert.equal(c.state, "disconnected");
});
