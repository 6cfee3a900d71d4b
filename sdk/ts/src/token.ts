/**
 * JWT helpers: read `exp` from a token's payload (no verification: the server does
 * that) and plan when to refresh.
 * @module
 */

function base64UrlDecode(s: string): string | undefined {
  const b64 = s.replace(/-/g, "+").replace(/_/g, "/");
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(b64)) return undefined;
  try {
    const bin = atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4));
    const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

/**
 * The `exp` claim of a JWT, seconds since the epoch; undefined when absent or unreadable.
 * @param token - a JWT `header.payload.signature`.
 */
export function tokenExp(token: string): number | undefined {
  const parts = token.split(".");
  if (parts.length !== 3 || !parts[1]) return undefined;
  const json = base64UrlDecode(parts[1]);
  if (json === undefined) return undefined;
  try {
    const claims: unknown = JSON.parse(json);
    if (typeof claims !== "object" || claims === null) return undefined;
    const exp = (claims as { exp?: unknown }).exp;
    return typeof exp === "number" && Number.isFinite(exp) ? exp : undefined;
  } catch {
    return undefined;
  }
}

/**
 * How long from `nowMs` until a token expiring at `expSecs` should be refreshed:
 * `beforeMs` ahead of exp when given, else at two thirds of its remaining life but at
 * most 60 s before exp; never below 1 s.
 * @param expSecs - the token's exp. @param nowMs - now. @param beforeMs - fixed lead.
 */
export function refreshDelay(expSecs: number, nowMs: number, beforeMs?: number): number {
  const left = expSecs * 1000 - nowMs;
  const lead = beforeMs ?? Math.min(60_000, left / 3);
  return Math.max(1000, Math.floor(left - lead));
}
