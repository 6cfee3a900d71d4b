/**
 * The sign-in the tab remembers: server URL and token in sessionStorage (gone when the
 * tab closes), and the user id read from the token's `sub` claim.
 */

const KEY = "im-web-chat.session";

/** What the tab remembers. */
export interface SavedSession {
  serverUrl: string;
  token: string;
}

/** Why a sign-in cannot start. */
export class SignInError extends Error {
  override readonly name = "SignInError";
}

/** The user id (`sub`) of a JWT; throws SignInError when it is not a readable JWT. */
export function tokenUser(token: string): string {
  const part = token.trim().split(".")[1];
  if (!part) throw new SignInError("the token is not a JWT (three dot-separated parts)");
  let claims: unknown;
  try {
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const bin = atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4));
    claims = JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (ch) => ch.charCodeAt(0))));
  } catch {
    throw new SignInError("the token's claims are not readable JSON");
  }
  const sub = typeof claims === "object" && claims !== null ? (claims as { sub?: unknown }).sub : undefined;
  if (typeof sub !== "string" || sub === "") throw new SignInError("the token has no user (sub claim)");
  return sub;
}

/** Checks a server URL: ws:// or wss://; throws SignInError otherwise. */
export function checkServerUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw.trim());
  } catch {
    throw new SignInError(`not a URL: ${raw}`);
  }
  if (url.protocol !== "ws:" && url.protocol !== "wss:") {
    throw new SignInError("the server URL must start with ws:// or wss://");
  }
  return url.toString();
}

/** The remembered session, or null. */
export function loadSession(storage: Storage): SavedSession | null {
  const raw = storage.getItem(KEY);
  if (!raw) return null;
  try {
    const v = JSON.parse(raw) as Partial<SavedSession>;
    if (typeof v.serverUrl === "string" && typeof v.token === "string") {
      return { serverUrl: v.serverUrl, token: v.token };
    }
  } catch {
    // A damaged entry is forgotten below.
  }
  storage.removeItem(KEY);
  return null;
}

/** Remembers the session for this tab. */
export function saveSession(storage: Storage, s: SavedSession): void {
  storage.setItem(KEY, JSON.stringify(s));
}

/** Forgets the session. */
export function clearSession(storage: Storage): void {
  storage.removeItem(KEY);
}
