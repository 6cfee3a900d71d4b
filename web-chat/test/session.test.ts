// Unit tests of the remembered sign-in: token user, URL check, and sessionStorage round trip.
import assert from "node:assert/strict";
import { test } from "node:test";
import { SignInError, checkServerUrl, clearSession, loadSession, saveSession, tokenUser } from "../src/session.js";
import { mintToken } from "./support.js";

/** sessionStorage's interface over a Map (Node has no Web Storage). */
class MapStorage implements Storage {
  private readonly m = new Map<string, string>();
  get length(): number {
    return this.m.size;
  }
  clear(): void {
    this.m.clear();
  }
  getItem(k: string): string | null {
    return this.m.get(k) ?? null;
  }
  key(i: number): string | null {
    return [...this.m.keys()][i] ?? null;
  }
  removeItem(k: string): void {
    this.m.delete(k);
  }
  setItem(k: string, v: string): void {
    this.m.set(k, v);
  }
}

test("tokenUser reads sub from a real token and refuses what is not one", () => {
  assert.equal(tokenUser(mintToken("alice")), "alice");
  assert.equal(tokenUser(`  ${mintToken("ünï")}\n`), "ünï");
  assert.throws(() => tokenUser("nonsense"), SignInError);
  assert.throws(() => tokenUser("a.!!!.c"), SignInError);
  const noSub = `x.${Buffer.from(JSON.stringify({ exp: 1 })).toString("base64url")}.y`;
  assert.throws(() => tokenUser(noSub), /no user/);
});

test("checkServerUrl wants ws:// or wss://", () => {
  assert.equal(checkServerUrl(" ws://127.0.0.1:7070/ws "), "ws://127.0.0.1:7070/ws");
  assert.throws(() => checkServerUrl("http://127.0.0.1:7070/ws"), SignInError);
  assert.throws(() => checkServerUrl("not a url"), SignInError);
});

test("the session round-trips and a damaged entry is forgotten", () => {
  const st = new MapStorage();
  assert.equal(loadSession(st), null);
  saveSession(st, { serverUrl: "ws://a/ws", token: "t" });
  assert.deepEqual(loadSession(st), { serverUrl: "ws://a/ws", token: "t" });
  clearSession(st);
  assert.equal(loadSession(st), null);
  st.setItem("im-web-chat.session", "{not json");
  assert.equal(loadSession(st), null);
  assert.equal(st.length, 0);
});
