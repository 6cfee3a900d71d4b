import assert from "node:assert/strict";
import { test } from "node:test";
import { refreshDelay, tokenExp } from "../../src/token.js";
import { mintToken } from "../support.js";

test("tokenExp reads exp from a JWT and refuses garbage", () => {
  const t = mintToken("alice", 100);
  const exp = tokenExp(t);
  assert.ok(exp !== undefined && Math.abs(exp - (Date.now() / 1000 + 100)) < 5);
  assert.equal(tokenExp("not-a-jwt"), undefined);
  assert.equal(tokenExp("a.%%%.c"), undefined);
  assert.equal(tokenExp(`a.${Buffer.from('{"sub":"x"}').toString("base64url")}.c`), undefined);
  assert.equal(tokenExp(`a.${Buffer.from('{"exp":"soon"}').toString("base64url")}.c`), undefined);
});

test("refreshDelay plans before exp, never below one second", () => {
  const now = 1_000_000_000;
  assert.equal(refreshDelay(now / 1000 + 90, now), 60_000);
  assert.equal(refreshDelay(now / 1000 + 3600, now), 3_540_000);
  assert.equal(refreshDelay(now / 1000 + 10, now, 4000), 6000);
  assert.equal(refreshDelay(now / 1000 - 10, now), 1000);
});
