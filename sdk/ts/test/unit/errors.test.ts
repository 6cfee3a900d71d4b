import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { toServerError } from "../../src/convert.js";
import { ServerError } from "../../src/errors.js";
import * as pb from "../../src/gen/im/v1/im_pb.js";
import { Outbox } from "../../src/outbox.js";

test("REJECTED_BY_HOOK maps to a ServerError with the hook's reason, and is final", async () => {
  const wire = create(pb.ErrorSchema, {
    code: pb.ErrorCode.REJECTED_BY_HOOK,
    message: "rejected by the before-send hook: links to that site are not allowed",
  });
  const e = toServerError(wire);
  assert.equal(e.kind, "server");
  assert.equal(e.code, "REJECTED_BY_HOOK");
  assert.equal(e.hookReason, "links to that site are not allowed");
  assert.equal(toServerError(create(pb.ErrorSchema, { code: pb.ErrorCode.REJECTED_BY_HOOK, message: "rejected by the before-send hook" })).hookReason, "");
  assert.equal(new ServerError("FORBIDDEN", "no", 0).hookReason, undefined);

  // The outbox does not retry it (unlike OVERLOADED): the send fails with this error.
  const o = new Outbox(4, undefined, () => 0);
  const sent = o.add({ op: "send", clientMsgId: "c1", target: { to: "bob" }, type: "TEXT", payload: new Uint8Array([1]), createdAt: 0 });
  o.take(0);
  assert.equal(o.refused("c1", e, 0), "failed");
  await assert.rejects(sent, (err: unknown) => err instanceof ServerError && err.code === "REJECTED_BY_HOOK");
  assert.equal(o.size, 0);
});
