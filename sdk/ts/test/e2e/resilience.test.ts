import assert from "node:assert/strict";
import { test } from "node:test";
import { directConversationId, KickedError, LoginRefusedError, type SendAck } from "../../src/index.js";
import { connectUser, makeUser, mintToken, sleep, TestServer, texts, waitFor } from "../support.js";

const names = (tc: { events: Array<{ name: string }> }, name: string): number => tc.events.filter((e) => e.name === name).length;

test("server SIGKILLed and restarted mid-send: nothing lost, nothing twice, all acked", async () => {
  const server = await TestServer.start();
  try {
    const a = await connectUser(server, "ka");
    const b = await connectUser(server, "kb");
    const conv = directConversationId("ka", "kb");
    const N = 300;
    const acks: Promise<SendAck>[] = [];
    for (let i = 0; i < N; i++) {
      acks.push(a.client.send({ to: "kb" }, `k${i}`));
      if (i === 100) await waitFor("some acks", () => a.client.pendingSends < 90);
      if (i === 150) {
        await server.kill();
        assert.equal(a.client.pendingSends > 0, true);
      }
    }
    await sleep(300);
    await server.restart();
    const all = await Promise.all(acks);
    assert.equal(all.length, N);
    assert.equal(new Set(all.map((x) => x.seq)).size, N, "every send has its own seq");
    await waitFor("b has all", () => b.messages.length >= N);
    await sleep(300);
    const got = texts(b.messages, conv);
    assert.equal(got.length, N, "delivered exactly once");
    assert.equal(new Set(got).size, N);
    const seqs = b.messages.map((m) => m.seq);
    assert.deepEqual(seqs, [...seqs].sort((x, y) => x - y), "in seq order");
    assert.ok(names(a, "disconnected") >= 1 && names(a, "connected") >= 2, "a reconnected");
    assert.equal(a.client.pendingSends, 0);
    await a.client.close();
    await b.client.close();
  } finally {
    await server.stop();
  }
});

test("offline sync pages until more=false, in order, once", async () => {
  const server = await TestServer.start({ IM_LIMITS_SYNC_LIMIT_MAX: "200" });
  try {
    const a = await connectUser(server, "oa", { outboxMax: 2000 });
    const N = 1100;
    const acks: Promise<SendAck>[] = [];
    for (let i = 0; i < N; i++) acks.push(a.client.send({ to: "ob" }, `o${i}`));
    await Promise.all(acks);
    const g = await a.client.createGroup({ members: ["ob"] });
    for (let i = 0; i < 10; i++) await a.client.send({ group: g.groupId }, `g${i}`);
    const b = await connectUser(server, "ob");
    await waitFor("b synced everything", () => b.messages.length >= N + 11);
    // Past the send burst some sends were RATE_LIMITED and retried, so their commit
    // order (seq) may differ from the send order: every one once, in seq order.
    const direct = b.messages.filter((m) => m.conversationId === directConversationId("oa", "ob"));
    assert.deepEqual(direct.map((m) => m.text).sort(), Array.from({ length: N }, (_, i) => `o${i}`).sort());
    assert.deepEqual(direct.map((m) => m.seq), Array.from({ length: N }, (_, i) => i + 1));
    assert.deepEqual(texts(b.messages, `g:${g.groupId}`).slice(1), Array.from({ length: 10 }, (_, i) => `g${i}`));
    // Acked cursors: a new connection of the same device has nothing left to sync.
    await b.client.close();
    // The server writes delivered cursors in the background: give it a moment.
    await sleep(500);
    const b2 = await connectUser(server, "ob");
    await sleep(500);
    assert.equal(b2.messages.length, 0);
    await b2.client.close();
    await a.client.close();
  } finally {
    await server.stop();
  }
});

test("token refreshed on the open connection before exp; 4003 revoke asks for a new token", async () => {
  const server = await TestServer.start({ IM_LIMITS_TOKEN_LEEWAY_SECS: "0" });
  try {
    let calls = 0;
    let revoked = false;
    const a = makeUser(server, "ta", {
      token: mintToken("ta", 3),
      getToken: async () => {
        calls += 1;
        // Revocation refuses tokens issued in its second or before.
        if (revoked) await sleep(1100);
        return mintToken("ta", 3);
      },
    });
    await a.client.connect();
    const b = await connectUser(server, "tb");
    // Past two token lifetimes: refreshed on the open connection, never disconnected.
    await sleep(7000);
    assert.ok(names(a, "tokenRefreshed") >= 2, `refreshed ${names(a, "tokenRefreshed")} times`);
    assert.equal(names(a, "disconnected"), 0);
    await b.client.send({ to: "ta" }, "still here");
    await waitFor("a still receives", () => a.messages.length === 1);
    // An operator's revocation closes 4003: the client gets a fresh token and comes back.
    const before = calls;
    revoked = true;
    const r = await server.admin("POST", "/admin/v1/users/ta/revoke");
    assert.equal(r.status, 200);
    await waitFor("a reconnected after 4003", () => names(a, "connected") >= 2);
    const d = a.events.find((e) => e.name === "disconnected")?.payload as { code: number };
    assert.equal(d.code, 4003);
    assert.ok(calls > before);
    await b.client.send({ to: "ta" }, "after revoke");
    await waitFor("a receives after revoke", () => a.messages.length === 2);
    await a.client.close();
    await b.client.close();
  } finally {
    await server.stop();
  }
});

test("rate limited sends are retried after retry_after_ms and arrive once", async () => {
  const server = await TestServer.start({ IM_LIMITS_SEND_RATE_PER_SEC: "50", IM_LIMITS_SEND_BURST: "5" });
  try {
    const a = await connectUser(server, "rla");
    const b = await connectUser(server, "rlb");
    // 200 at once at 50/s: four seconds of backlog, paced without a flood close.
    const N = 200;
    const acks = await Promise.all(Array.from({ length: N }, (_, i) => a.client.send({ to: "rlb" }, `rl${i}`)));
    assert.equal(new Set(acks.map((x) => x.seq)).size, N);
    await waitFor("b has all", () => b.messages.length >= N);
    await sleep(200);
    assert.equal(b.messages.length, N);
    assert.equal(new Set(texts(b.messages)).size, N);
    assert.equal(names(a, "disconnected"), 0, "never closed as a flood");
    await a.client.close();
    await b.client.close();
  } finally {
    await server.stop();
  }
});

test("login refused stops with a typed error, no hot loop; kicked stops with KickedError", async () => {
  const server = await TestServer.start();
  try {
    const bad = makeUser(server, "la", { token: "e30.e30.bad" });
    await assert.rejects(bad.client.connect(), (e: unknown) => e instanceof LoginRefusedError);
    assert.equal(bad.client.state, "closed");
    assert.equal(names(bad, "connecting"), 1);
    // With a provider that keeps handing out bad tokens: one fresh try, then stop.
    let calls = 0;
    const bad2 = makeUser(server, "lb", { token: "e30.e30.bad", getToken: async () => (calls++, "e30.e30.bad") });
    await assert.rejects(bad2.client.connect(), (e: unknown) => e instanceof LoginRefusedError);
    assert.equal(calls, 1);

    const k = await connectUser(server, "kk");
    const list = (await (await server.admin("GET", "/admin/v1/connections?user=kk")).json()) as {
      connections: Array<{ conn_id: number; user_id: string }>;
    };
    const id = list.connections.find((c) => c.user_id === "kk")?.conn_id;
    assert.ok(id !== undefined);
    assert.equal((await server.admin("DELETE", `/admin/v1/connections/${id}`)).status, 200);
    await waitFor("closed", () => k.client.state === "closed");
    const closed = k.events.find((e) => e.name === "closed")?.payload as { error?: unknown };
    assert.ok(closed.error instanceof KickedError);
  } finally {
    await server.stop();
  }
});

test("a frozen server is detected by the heartbeat and the client reconnects", async () => {
  const server = await TestServer.start();
  try {
    const a = await connectUser(server, "fa", { heartbeatMs: 200, connectTimeoutMs: 1000 });
    server.signal("SIGSTOP");
    await waitFor("a saw the connection die", () => names(a, "disconnected") >= 1, 10_000);
    server.signal("SIGCONT");
    await waitFor("a reconnected", () => names(a, "connected") >= 2, 20_000);
    const b = await connectUser(server, "fb");
    await b.client.send({ to: "fa" }, "after the freeze");
    await waitFor("a receives", () => a.messages.length === 1);
    await a.client.close();
    await b.client.close();
  } finally {
    server.signal("SIGCONT");
    await server.stop();
  }
});

test("notify-and-pull: a group above the threshold is fetched by sync after the hint", async () => {
  const server = await TestServer.start({ IM_FLOW_NOTIFY_GROUP_THRESHOLD: "2" });
  try {
    const a = await connectUser(server, "na");
    const b = await connectUser(server, "nb");
    const c = await connectUser(server, "nc");
    const g = await a.client.createGroup({ members: ["nb", "nc"] });
    for (let i = 0; i < 20; i++) await a.client.send({ group: g.groupId }, `n${i}`);
    const conv = `g:${g.groupId}`;
    await waitFor("b has all 20", () => texts(b.messages, conv).filter((t) => t.startsWith("n")).length === 20);
    assert.deepEqual(texts(b.messages, conv).filter((t) => t.startsWith("n")), Array.from({ length: 20 }, (_, i) => `n${i}`));
    const seqs = b.messages.filter((m) => m.conversationId === conv).map((m) => m.seq);
    assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => (seqs[0] ?? 0) + i));
    for (const x of [a, b, c]) await x.client.close();
  } finally {
    await server.stop();
  }
});
