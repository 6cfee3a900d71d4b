/**
 * The outbox: every send, recall and edit waits here, under its client_msg_id, until
 * the server acknowledges it. Bounded (refuses with {@link OutboxFullError} when full),
 * persisted through an {@link OutboxStore}, resent with the same id after reconnects.
 * Two brakes keep a refused burst from turning into a flood of refusals (which the
 * server closes 1008): a window of entries in flight that halves on OVERLOADED and
 * grows back on acks, and, after RATE_LIMITED, a pacer that sends one entry per
 * interval (first a little slower than the server's retry_after_ms, the time one
 * token takes), speeding up a little with each ack (about 1.4 times per second paced)
 * until it is off again and slowing down by half again each time it is refused anyway:
 * it settles just under the server's rate with about one refusal a second.
 * @module
 */

import { retryDelay } from "./backoff.js";
import { OutboxFullError, type ImError, type ServerError } from "./errors.js";
import { MemoryOutboxStore, type OutboxEntry, type OutboxStore } from "./store.js";
import type { SendAck } from "./types.js";

/** First number of outbox entries in flight at once. */
export const WINDOW_START = 32;
/** Largest congestion window. */
export const WINDOW_MAX = 1024;
/** How much slower the pacer goes when refused again while pacing. */
export const PACE_BACKOFF = 1.5;
/** How fast the pacer speeds up: its rate grows by e^0.35 (about 1.4) per second paced. */
export const PACE_SPEEDUP_PER_SEC = 0.25;

interface Pending {
  entry: OutboxEntry;
  inflight: boolean;
  resolve?: (ack: SendAck) => void;
  reject?: (e: ImError) => void;
}

/** What a refusal did to its entry. */
export type Refusal = "retry" | "failed" | "unknown";

/** The bounded, persisted queue of unacknowledged operations. */
export class Outbox {
  private readonly pending = new Map<string, Pending>();
  private inflightCount = 0;
  private window = WINDOW_START;
  private pausedUntil = 0;
  private paceMs = 0;
  private nextAt = 0;
  /** The persistence adapter. */
  readonly store: OutboxStore;

  /**
   * @param max - most entries held. @param store - persistence (default: memory).
   * @param random - jitter source.
   */
  constructor(
    readonly max: number,
    store?: OutboxStore,
    private readonly random: () => number = Math.random,
  ) {
    this.store = store ?? new MemoryOutboxStore();
  }

  /** Entries not yet acknowledged. */
  get size(): number {
    return this.pending.size;
  }

  /** Entries sent and not yet answered. */
  get inflight(): number {
    return this.inflightCount;
  }

  /** The current congestion window. */
  get currentWindow(): number {
    return Math.floor(this.window);
  }

  /**
   * Queues an entry; resolves with its ack. Throws {@link OutboxFullError} when full
   * (synchronously, so nothing is stored). The same client_msg_id queued twice shares
   * the first's fate.
   * @param entry - the operation.
   */
  add(entry: OutboxEntry): Promise<SendAck> {
    const existing = this.pending.get(entry.clientMsgId);
    if (existing) {
      return new Promise((resolve, reject) => {
        const [r0, j0] = [existing.resolve, existing.reject];
        existing.resolve = (a) => (r0?.(a), resolve(a));
        existing.reject = (e) => (j0?.(e), reject(e));
      });
    }
    if (this.pending.size >= this.max) throw new OutboxFullError(this.max);
    const p: Pending = { entry, inflight: false };
    const promise = new Promise<SendAck>((resolve, reject) => {
      p.resolve = resolve;
      p.reject = reject;
    });
    this.pending.set(entry.clientMsgId, p);
    return promise;
  }

  /**
   * Takes back entries a previous run left in the store (no caller waits on them: their
   * acks go out as events). Entries over the bound are kept in the store, not queued.
   * @param entries - from `store.load()`.
   */
  restore(entries: OutboxEntry[]): void {
    for (const e of entries) {
      if (this.pending.size >= this.max) break;
      if (!this.pending.has(e.clientMsgId)) this.pending.set(e.clientMsgId, { entry: e, inflight: false });
    }
  }

  /**
   * Entries to send now (oldest first), marked in flight; empty while paused or while
   * the window is full. @param now - ms.
   */
  take(now: number): OutboxEntry[] {
    if (now < this.pausedUntil || now < this.nextAt) return [];
    let room = Math.floor(this.window) - this.inflightCount;
    if (this.paceMs > 0) {
      room = Math.min(room, 1);
      this.nextAt = now + this.paceMs;
    }
    const out: OutboxEntry[] = [];
    if (room <= 0) return out;
    for (const p of this.pending.values()) {
      if (out.length >= room) break;
      if (p.inflight) continue;
      p.inflight = true;
      this.inflightCount += 1;
      out.push(p.entry);
    }
    return out;
  }

  /** Ms until the pause ends (0: not paused). @param now - ms. */
  pausedFor(now: number): number {
    const pending = this.pending.size > this.inflightCount;
    return pending ? Math.max(0, this.pausedUntil - now, Math.ceil(this.nextAt - now)) : 0;
  }

  /** The pacer's interval, ms (0: not pacing). */
  get pace(): number {
    return this.paceMs;
  }

  /**
   * An entry was acknowledged: resolves its caller, grows the window; returns whether it
   * was ours. @param ack - the server's ack.
   */
  acked(ack: SendAck): boolean {
    const p = this.pending.get(ack.clientMsgId);
    if (!p) return false;
    this.pending.delete(ack.clientMsgId);
    if (p.inflight) this.inflightCount -= 1;
    this.window = Math.min(WINDOW_MAX, this.window + 1 / Math.max(1, this.window) + (this.window < WINDOW_START ? 1 : 0));
    if (this.paceMs > 0) {
      // Each ack takes one interval of pacing: speed up by PACE_SPEEDUP_PER_SEC for
      // each second of it, so refusals come about once a second whatever the rate.
      this.paceMs *= Math.exp((-PACE_SPEEDUP_PER_SEC * this.paceMs) / 1000);
      if (this.paceMs < 1) this.paceMs = 0;
    }
    p.resolve?.(ack);
    return true;
  }

  /**
   * An entry was refused. RATE_LIMITED and OVERLOADED put it back (the whole outbox
   * pauses for retry_after_ms, the window halves); anything else fails it for good.
   * @param clientMsgId - the entry. @param err - the server's error. @param now - ms.
   */
  refused(clientMsgId: string, err: ServerError, now: number): Refusal {
    const p = this.pending.get(clientMsgId);
    if (!p) return "unknown";
    if (p.inflight) {
      p.inflight = false;
      this.inflightCount -= 1;
    }
    if (err.code === "RATE_LIMITED" || err.code === "OVERLOADED") {
      // Only news slows us down: a refusal of an entry sent after the last pause ended.
      // The rest of a burst already in flight is refused too, and says nothing new.
      const news = now >= this.pausedUntil;
      const until = now + retryDelay(err.retryAfterMs, this.random);
      if (until > this.pausedUntil) this.pausedUntil = until;
      if (news && err.code === "OVERLOADED") this.window = Math.max(1, this.window / 2);
      // retry_after_ms is the wait for the next token, not the token interval: a pacer
      // just a little too fast hears a few ms. So a refusal while pacing slows the pacer
      // down by half again, and the hint is only its floor.
      if (news && err.code === "RATE_LIMITED") {
        this.paceMs = Math.max(this.paceMs * PACE_BACKOFF, Math.max(1, err.retryAfterMs) * 1.25);
      }
      return "retry";
    }
    this.pending.delete(clientMsgId);
    p.reject?.(err);
    return "failed";
  }

  /** The connection is gone: everything in flight is to be resent. */
  disconnected(): void {
    for (const p of this.pending.values()) p.inflight = false;
    this.inflightCount = 0;
  }

  /** The client closed: callers fail; the store keeps the entries for the next run. @param err - the reason. */
  close(err: ImError): void {
    for (const p of this.pending.values()) p.reject?.(err);
    this.pending.clear();
    this.inflightCount = 0;
  }
}
