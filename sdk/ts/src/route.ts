/**
 * Node choice: asks `GET {routeUrl}/v1/route[?avoid=node]` which node a new connection
 * should go to, falling back to the configured URL when the route call fails (no
 * answer, not JSON, CORS refused in a browser, a draining node's 503). In multi-region
 * mode (the answer lists `regions`) the SDK probes every region's entry point once (the
 * time one route call takes; again after five minutes), keeps them nearest first in a
 * {@link RegionBook}, connects through the nearest one that answers, and skips one that
 * does not, so a lost region fails over to the next nearest.
 * @module
 */

import { validId } from "./validate.js";

/** The route base URL for a ws URL: ws to http, wss to https, same host and port. @param ws - the ws URL. */
export function routeBaseOf(ws: URL): string {
  return `${ws.protocol === "wss:" ? "https:" : "http:"}//${ws.host}`;
}

/** How long a probe order is trusted before the regions are probed again, in ms. */
export const REPROBE_AFTER_MS = 300_000;
/** Most regions probed. */
export const MAX_PROBED = 16;

/** One region of a route answer. */
export interface RouteRegion {
  /** Its name. */
  name: string;
  /** Where its `/v1/route` is asked. */
  routeUrl: string;
}

/** One probed region: its round trip in ms, or undefined when it did not answer. */
export interface Probe extends RouteRegion {
  /** The probe's round trip (ms); undefined: failed or timed out. */
  rttMs: number | undefined;
}

/** The probed regions, nearest first; one per client. */
export class RegionBook {
  private at = 0;
  private probes: Probe[] = [];
  /** The probes, nearest first (the ones that failed last). */
  order(): Probe[] {
    return [...this.probes];
  }
  /** The probes, unless older than {@link REPROBE_AFTER_MS}. @param now - ms clock. */
  fresh(now = Date.now()): Probe[] | undefined {
    return this.probes.length > 0 && now - this.at < REPROBE_AFTER_MS ? this.order() : undefined;
  }
  /** Keeps `probes` as of `now`. @param probes - nearest first. @param now - ms clock. */
  store(probes: Probe[], now = Date.now()): void {
    this.probes = [...probes];
    this.at = now;
  }
}

/** A route answer: the node's ws URL and, in multi-region mode, its region and the list. */
interface Answer {
  ws: string;
  region: string;
  regions: RouteRegion[];
}

/** One `GET {base}/v1/route`; throws a message on any failure. */
async function ask(base: string, avoid: string | undefined, timeoutMs: number): Promise<Answer> {
  const q = avoid && validId(avoid) ? `?avoid=${encodeURIComponent(avoid)}` : "";
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const res = await fetch(`${base.replace(/\/+$/, "")}/v1/route${q}`, { signal: ctl.signal });
    if (!res.ok) throw new Error(`route answered ${res.status}`);
    const body = (await res.json()) as { ws_url?: unknown; region?: unknown; regions?: unknown } | null;
    const ws = body?.ws_url;
    if (typeof ws !== "string" || !/^wss?:\/\//.test(ws)) throw new Error("route answer has no ws_url");
    const regions: RouteRegion[] = [];
    if (Array.isArray(body?.regions)) {
      for (const r of body.regions.slice(0, MAX_PROBED) as { name?: unknown; route_url?: unknown }[]) {
        if (typeof r?.name === "string" && typeof r.route_url === "string" && /^https?:\/\//.test(r.route_url)) {
          regions.push({ name: r.name, routeUrl: r.route_url });
        }
      }
    }
    return { ws, region: typeof body?.region === "string" ? body.region : "", regions };
  } catch (e) {
    throw new Error(ctl.signal.aborted ? "route timed out" : `route failed: ${String(e instanceof Error ? e.message : e)}`);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Probes every region at once; nearest first, the ones that did not answer last.
 * @param regions - from a route answer. @param timeoutMs - limit per probe.
 */
export async function probeRegions(regions: RouteRegion[], timeoutMs: number): Promise<Probe[]> {
  const probes = await Promise.all(
    regions.slice(0, MAX_PROBED).map(async (r) => {
      const t0 = performance.now();
      try {
        await ask(r.routeUrl, undefined, timeoutMs);
        return { ...r, rttMs: performance.now() - t0 };
      } catch {
        return { ...r, rttMs: undefined };
      }
    }),
  );
  return probes.sort((a, b) => (a.rttMs ?? Infinity) - (b.rttMs ?? Infinity));
}

/** The nearest region's answer, trying them in order; undefined when none answers. */
async function nearest(order: Probe[], first: Answer | undefined, avoid: string | undefined, timeoutMs: number): Promise<Answer | undefined> {
  for (const p of order) {
    if (first && first.region === p.name && p.rttMs !== undefined) return first;
    try {
      return await ask(p.routeUrl, avoid, timeoutMs);
    } catch {
      // next region
    }
  }
  return undefined;
}

/**
 * The WebSocket URL to connect to, and whether it came from the route answer.
 * @param routeUrl - base URL, or undefined for no routing. @param fallback - the configured ws URL.
 * @param avoid - a node to leave out (the one just lost). @param timeoutMs - limit.
 * @param book - the client's probed regions (multi-region mode), filled here.
 */
export async function chooseUrl(
  routeUrl: string | undefined,
  fallback: string,
  avoid: string | undefined,
  timeoutMs: number,
  book?: RegionBook,
): Promise<{ url: string; routed: boolean; error?: string }> {
  if (routeUrl === undefined || typeof fetch !== "function") return { url: fallback, routed: false };
  const known = book?.fresh();
  if (known) {
    const a = await nearest(known, undefined, avoid, timeoutMs);
    if (a) return { url: a.ws, routed: true };
  }
  let first: Answer;
  try {
    first = await ask(routeUrl, avoid, timeoutMs);
  } catch (e) {
    return { url: fallback, routed: false, error: e instanceof Error ? e.message : String(e) };
  }
  if (book && first.regions.length > 0) {
    const order = await probeRegions(first.regions, timeoutMs);
    book.store(order);
    const a = await nearest(order, first, avoid, timeoutMs);
    if (a) return { url: a.ws, routed: true };
  }
  return { url: first.ws, routed: true };
}
