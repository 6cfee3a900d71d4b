/**
 * Node choice: asks `GET {routeUrl}/v1/route[?avoid=node]` which node a new connection
 * should go to, falling back to the configured URL when the route call fails (no
 * answer, not JSON, CORS refused in a browser, a draining node's 503).
 * @module
 */

import { validId } from "./validate.js";

/** The route base URL for a ws URL: ws to http, wss to https, same host and port. @param ws - the ws URL. */
export function routeBaseOf(ws: URL): string {
  return `${ws.protocol === "wss:" ? "https:" : "http:"}//${ws.host}`;
}

/**
 * The WebSocket URL to connect to, and whether it came from the route answer.
 * @param routeUrl - base URL, or undefined for no routing. @param fallback - the configured ws URL.
 * @param avoid - a node to leave out (the one just lost). @param timeoutMs - limit.
 */
export async function chooseUrl(
  routeUrl: string | undefined,
  fallback: string,
  avoid: string | undefined,
  timeoutMs: number,
): Promise<{ url: string; routed: boolean; error?: string }> {
  if (routeUrl === undefined || typeof fetch !== "function") return { url: fallback, routed: false };
  const q = avoid && validId(avoid) ? `?avoid=${encodeURIComponent(avoid)}` : "";
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const res = await fetch(`${routeUrl.replace(/\/+$/, "")}/v1/route${q}`, { signal: ctl.signal });
    if (!res.ok) return { url: fallback, routed: false, error: `route answered ${res.status}` };
    const body: unknown = await res.json();
    const ws = (body as { ws_url?: unknown } | null)?.ws_url;
    if (typeof ws !== "string" || !/^wss?:\/\//.test(ws)) {
      return { url: fallback, routed: false, error: "route answer has no ws_url" };
    }
    return { url: ws, routed: true };
  } catch (e) {
    return { url: fallback, routed: false, error: `route failed: ${String(e)}` };
  } finally {
    clearTimeout(timer);
  }
}
