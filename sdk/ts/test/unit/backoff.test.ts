import assert from "node:assert/strict";
import { test } from "node:test";
import { Backoff, retryDelay } from "../../src/backoff.js";
import { TypingThrottle } from "../../src/typing.js";

test("full jitter: delays within [0, ceiling], ceiling doubles up to max, reset", () => {
  const hi = new Backoff(100, 1000, () => 0.999999);
  assert.deepEqual([hi.next(), hi.next(), hi.next(), hi.next(), hi.next()], [100, 200, 400, 800, 1000]);
  const lo = new Backoff(100, 1000, () => 0);
  assert.deepEqual([lo.next(), lo.next()], [0, 0]);
  hi.reset();
  assert.equal(hi.ceiling(), 100);
  const real = new Backoff(50, 400);
  for (let i = 0; i < 50; i++) {
    const c = real.ceiling();
    const d = real.next();
    assert.ok(d >= 0 && d <= c && c <= 400);
  }
});

test("retry delay: retry_after_ms plus up to a quarter, at least 1 ms", () => {
  assert.equal(retryDelay(100, () => 0), 100);
  assert.equal(retryDelay(100, () => 0.999), 125);
  assert.equal(retryDelay(0, () => 0), 1);
});

test("typing throttle: true once per interval per conversation, stop only after a start, rate capped", () => {
  const t = new TypingThrottle(3000);
  assert.equal(t.allow("c", true, 1000), true);
  assert.equal(t.allow("c", true, 2000), false);
  assert.equal(t.allow("c", true, 4000), true);
  assert.equal(t.allow("c", false, 4100), true);
  assert.equal(t.allow("c", false, 4200), false);
  // The burst of 10 frames, then 2 per second.
  const u = new TypingThrottle(1);
  let sent = 0;
  for (let i = 0; i < 40; i++) if (u.allow(`k${i}`, true, 10_000)) sent++;
  assert.equal(sent, 10, "the burst");
  assert.equal(u.allow("late", true, 10_400), false, "0.8 tokens refilled");
  assert.equal(u.allow("late", true, 10_500), true, "one token after half a second");
});
