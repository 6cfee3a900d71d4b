import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { directConversationId, InvalidArgumentError, ServerError } from "../../src/index.js";
import { connectUser, TestServer, texts, waitFor } from "../support.js";

let server: TestServer;
before(async () => {
  server = await TestServer.start();
});
after(async () => {
  await server.stop();
});

test("one-to-one: sends are acked, delivered once and in order, both ways", async () => {
  const alice = await connectUser(server, "alice");
  const bob = await connectUser(server, "bob");
  const conv = directConversationId("alice", "bob");
  const acks = await Promise.all(Array.from({ length: 50 }, (_, i) => alice.client.send({ to: "bob" }, `m${i}`)));
  assert.equal(new Set(acks.map((a) => a.seq)).size, 50);
  assert.ok(acks.every((a) => a.conversationId === conv && !a.duplicate));
  const queued = alice.events.filter((e) => e.name === "queued").map((e) => (e.payload as { clientMsgId: string }).clientMsgId);
  assert.deepEqual(new Set(queued), new Set(acks.map((a) => a.clientMsgId)), "each send was stored before its ack");
  await waitFor("bob has 50", () => bob.messages.length >= 50);
  assert.deepEqual(texts(bob.messages, conv), Array.from({ length: 50 }, (_, i) => `m${i}`));
  assert.deepEqual(
    bob.messages.map((m) => m.seq),
    [...acks.map((a) => a.seq)].sort((a, b) => a - b),
  );
  assert.ok(bob.messages.every((m) => m.sender === "alice" && m.type === "TEXT"));
  const back = await bob.client.send({ to: "alice" }, "hi alice");
  await waitFor("alice has the reply", () => alice.messages.length === 1);
  assert.equal(alice.messages[0]?.seq, back.seq);
  // Own sends are not echoed to the sender.
  assert.equal(bob.messages.length, 50);
  await alice.client.close();
  await bob.client.close();
  assert.equal(alice.client.state, "closed");
});

test("bad input is refused with typed errors and never reaches the server", async () => {
  const a = await connectUser(server, "bi");
  await a.client.ping();
  const msgsIn = async (): Promise<number> => {
    const r = (await (await server.admin("GET", "/admin/v1/connections?user=bi")).json()) as {
      connections: Array<{ user_id: string; msgs_in: number }>;
    };
    return r.connections.find((c) => c.user_id === "bi")?.msgs_in ?? -1;
  };
  const before = await msgsIn();
  assert.ok(before > 0, "the admin API lists the connection");
  const bad: Array<Promise<unknown>> = [
    a.client.send({ to: "no such:user" }, "x"),
    a.client.send({ to: "bob" }, ""),
    a.client.send({ to: "bob" }, new Uint8Array(70 * 1024)),
    a.client.send({ group: "" }, "x"),
    a.client.markRead("nonsense", 1),
    a.client.createGroup({ members: ["ok", "bad user"] }),
  ];
  for (const p of bad) await assert.rejects(p, (e: unknown) => e instanceof InvalidArgumentError);
  assert.equal(await msgsIn(), before, "nothing was sent");
  // The server's own refusals arrive typed too.
  await assert.rejects(a.client.groupInfo("nosuchgroup"), (e: unknown) => e instanceof ServerError && e.code === "NOT_FOUND");
  await a.client.close();
});

test("node choice: GET /v1/route picks the URL; a failing route falls back to the given URL", async () => {
  const routed = await connectUser(server, "rt1");
  const c = routed.events.find((e) => e.name === "connected")?.payload as { url: string };
  const answer = (await (await fetch(`http://${server.clientAddr}/v1/route`)).json()) as { ws_url: string };
  assert.equal(c.url, answer.ws_url);
  assert.ok(!routed.events.some((e) => e.name === "error"), "the route answered");
  // Nothing listens on port 1: the route call fails, the client connects to `url`.
  const fallback = await connectUser(server, "rt2", { routeUrl: "http://127.0.0.1:1" });
  assert.equal(fallback.client.state, "connected");
  const err = fallback.events.find((e) => e.name === "error")?.payload as Error;
  assert.match(err.message, /route failed/);
  await routed.client.close();
  await fallback.client.close();
});
