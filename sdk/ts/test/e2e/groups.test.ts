import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { groupConversationId, ServerError, type GroupEvent } from "../../src/index.js";
import { connectUser, TestServer, waitFor } from "../support.js";

let server: TestServer;
before(async () => {
  server = await TestServer.start();
});
after(async () => {
  await server.stop();
});

/** The decoded group events a client has seen in a group, in order. */
function events(msgs: { conversationId: string; groupEvent?: GroupEvent }[], conv: string): GroupEvent[] {
  return msgs.filter((m) => m.conversationId === conv && m.groupEvent).map((m) => m.groupEvent as GroupEvent);
}

test("groups: every op and role, SYSTEM GroupEvents decoded, refusals typed", async () => {
  const owner = await connectUser(server, "gowner");
  const ann = await connectUser(server, "gann");
  const ben = await connectUser(server, "gben");
  const cid = await connectUser(server, "gcid");

  const g = await owner.client.createGroup({ groupId: "team1", members: ["gann"] });
  assert.deepEqual([g.groupId, g.role, g.kind, g.members], ["team1", "OWNER", "PRIVATE", 2]);
  const conv = groupConversationId("team1");

  // A plain member may not add others in a private group without members_can_invite.
  await assert.rejects(ann.client.addMembers("team1", ["gben"]), (e: unknown) => e instanceof ServerError && e.code === "FORBIDDEN");
  assert.equal((await owner.client.addMembers("team1", ["gben"])).members, 3);
  assert.equal((await owner.client.setRole("team1", ["gann"], "ADMIN")).role, "OWNER");
  assert.equal((await ann.client.groupInfo("team1")).role, "ADMIN");
  // An admin removes a member and bans, then lifts the ban.
  await ann.client.removeMembers("team1", ["gben"]);
  await ann.client.banMembers("team1", ["gcid"]);
  await assert.rejects(owner.client.addMembers("team1", ["gcid"]), (e: unknown) => e instanceof ServerError && e.code === "FORBIDDEN");
  await ann.client.unbanMembers("team1", ["gcid"]);
  await owner.client.addMembers("team1", ["gcid"]);
  const msg = await cid.client.send({ group: "team1" }, "hello team");
  await waitFor("ann has cid's message", () => ann.messages.some((m) => m.msgId === msg.msgId));
  // Transfer: the owner becomes an admin; the new owner dissolves.
  const t = await owner.client.transferOwnership("team1", "gann");
  assert.equal(t.role, "ADMIN");
  assert.equal((await ann.client.groupInfo("team1")).role, "OWNER");
  await ann.client.dissolveGroup("team1");
  await assert.rejects(owner.client.groupInfo("team1"), (e: unknown) => e instanceof ServerError && ["NOT_FOUND", "NOT_MEMBER"].includes(e.code));

  await waitFor("ann saw the dissolve", () => events(ann.messages, conv).some((e) => e.op === "DISSOLVE"));
  // UNBAN writes no event (it changes no membership).
  const ops = events(ann.messages, conv).map((e) => e.op);
  assert.deepEqual(ops, ["CREATE", "ADD", "SET_ROLE", "REMOVE", "BAN", "ADD", "TRANSFER", "DISSOLVE"]);
  const evs = events(ann.messages, conv);
  assert.equal(evs[0]?.actor, "gowner");
  assert.equal(evs[2]?.role, "ADMIN");
  assert.deepEqual(evs[3]?.users, ["gben"]);
  // Ann's view of the group is gap-free and in order.
  const seqs = ann.messages.filter((m) => m.conversationId === conv).map((m) => m.seq);
  assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => (seqs[0] ?? 0) + i));
  // Ben got the event that removed him (and nothing after it).
  await waitFor("ben saw his removal", () => events(ben.messages, conv).some((e) => e.op === "REMOVE"));
  assert.ok(!ben.messages.some((m) => m.msgId === msg.msgId));
  for (const c of [owner, ann, ben, cid]) await c.client.close();
});

test("groups: public join, leave, members_can_invite", async () => {
  const a = await connectUser(server, "pa");
  const b = await connectUser(server, "pb");
  const c = await connectUser(server, "pc");
  const g = await a.client.createGroup({ kind: "PUBLIC", membersCanInvite: true });
  assert.ok(g.groupId.length > 0, "the server names the group");
  assert.equal(g.kind, "PUBLIC");
  assert.equal((await b.client.joinGroup(g.groupId)).role, "MEMBER");
  assert.equal((await b.client.addMembers(g.groupId, ["pc"])).members, 3);
  assert.equal((await c.client.leaveGroup(g.groupId)).role, "NONE");
  await assert.rejects(a.client.leaveGroup(g.groupId), (e: unknown) => e instanceof ServerError && e.code === "FORBIDDEN");
  const conv = groupConversationId(g.groupId);
  await waitFor("a saw join, add, leave", () => events(a.messages, conv).length >= 4);
  assert.deepEqual(events(a.messages, conv).map((e) => e.op), ["CREATE", "JOIN", "ADD", "LEAVE"]);
  assert.equal(events(a.messages, conv)[0]?.kind, "PUBLIC");
  for (const x of [a, b, c]) await x.client.close();
});
