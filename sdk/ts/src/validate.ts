/**
 * Argument checks done before anything is sent, each failing with an
 * {@link InvalidArgumentError} naming the argument.
 * @module
 */

import { InvalidArgumentError } from "./errors.js";
import type { Target } from "./types.js";

/** Largest user or group id, bytes (the wire contract's MAX_ID_LEN). */
export const MAX_ID_LEN = 64;

const ID_RE = /^[A-Za-z0-9_.@-]+$/;

/**
 * Whether `id` is a valid user or group id: 1..64 bytes of `[A-Za-z0-9_.@-]`.
 * @param id - the id.
 */
export function validId(id: unknown): id is string {
  return typeof id === "string" && id.length > 0 && id.length <= MAX_ID_LEN && ID_RE.test(id);
}

/** Throws unless `id` is a valid user or group id. @param name - argument name. @param id - the id. */
export function checkId(name: string, id: unknown): string {
  if (!validId(id)) {
    throw new InvalidArgumentError(name, `not a valid id (1-${MAX_ID_LEN} of A-Z a-z 0-9 _ . @ -): ${JSON.stringify(id)}`);
  }
  return id;
}

/** Throws unless every entry is a valid id. @param name - argument name. @param ids - the ids. */
export function checkIds(name: string, ids: unknown): string[] {
  if (!Array.isArray(ids)) throw new InvalidArgumentError(name, "must be an array of ids");
  ids.forEach((id, i) => checkId(`${name}[${i}]`, id));
  return ids as string[];
}

/** Throws unless `t` names one valid user or group. @param t - the target. */
export function checkTarget(t: unknown): Target {
  if (typeof t !== "object" || t === null) throw new InvalidArgumentError("target", "must be {to} or {group}");
  const to = (t as { to?: unknown }).to;
  const group = (t as { group?: unknown }).group;
  if ((to === undefined) === (group === undefined)) {
    throw new InvalidArgumentError("target", "must name exactly one of to (a user) or group");
  }
  return to !== undefined ? { to: checkId("target.to", to) } : { group: checkId("target.group", group) };
}

/** Throws unless `c` looks like a conversation id (`u:a:b` or `g:id`). @param c - the id. */
export function checkConversation(c: unknown): string {
  if (typeof c === "string") {
    const p = c.split(":");
    if (p[0] === "u" && p.length === 3 && validId(p[1]) && validId(p[2])) return c;
    if (p[0] === "g" && p.length === 2 && validId(p[1])) return c;
  }
  throw new InvalidArgumentError("conversationId", `not a conversation id (u:<a>:<b> or g:<group>): ${JSON.stringify(c)}`);
}

/** Throws unless `n` is a whole number >= `min`. @param name - argument name. @param n - the value. @param min - lowest allowed. */
export function checkSeq(name: string, n: unknown, min = 1): number {
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n < min) {
    throw new InvalidArgumentError(name, `must be a whole number >= ${min}: ${String(n)}`);
  }
  return n;
}

const encoder = new TextEncoder();

/**
 * The payload as bytes; throws when it is empty, not text or bytes, or over `max` bytes.
 * @param p - text or bytes. @param max - the size cap.
 */
export function checkPayload(p: unknown, max: number): Uint8Array {
  let bytes: Uint8Array;
  if (typeof p === "string") bytes = encoder.encode(p);
  else if (p instanceof Uint8Array) bytes = p;
  else throw new InvalidArgumentError("payload", "must be a string or a Uint8Array");
  if (bytes.length === 0) throw new InvalidArgumentError("payload", "is empty");
  if (bytes.length > max) throw new InvalidArgumentError("payload", `is ${bytes.length} bytes, over the ${max}-byte cap`);
  return bytes;
}

function checkUrl(name: string, url: unknown, protocols: [string, string]): URL {
  let u: URL;
  try {
    u = new URL(String(url));
  } catch {
    throw new InvalidArgumentError(name, `not a URL: ${JSON.stringify(url)}`);
  }
  if (!protocols.includes(u.protocol)) {
    throw new InvalidArgumentError(name, `must be ${protocols.map((p) => `${p}//`).join(" or ")}, got ${u.protocol}`);
  }
  return u;
}

/** Throws unless `url` is a ws:// or wss:// URL. @param url - the URL. */
export function checkWsUrl(url: unknown): URL {
  return checkUrl("url", url, ["ws:", "wss:"]);
}

/** Throws unless `url` is an http:// or https:// URL. @param url - the URL. */
export function checkHttpUrl(url: unknown): URL {
  return checkUrl("routeUrl", url, ["http:", "https:"]);
}
