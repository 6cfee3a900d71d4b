/**
 * The sync engine: pages `SyncRequest`s until `more = false`, from the SDK's own cursor
 * for conversations held above a hole and from the server's stored cursors for the
 * rest, feeding every message through the {@link SeqTracker} so the app gets each once
 * and in order. One sync runs at a time; asking for one while it runs queues exactly
 * one more. RATE_LIMITED pages are paced, NOT_MEMBER for a conversation we named gives
 * up its hole.
 * @module
 */

import type { ImError } from "./errors.js";
import { ServerError } from "./errors.js";
import type { SeqTracker } from "./tracker.js";
import type { Message } from "./types.js";

/** Messages per sync page asked for. */
export const SYNC_LIMIT = 500;
/** Most cursors one SyncRequest names. */
export const MAX_SYNC_CURSORS = 10_000;

/** What the engine needs from the client. */
export interface SyncHost {
  /** Sends a SyncRequest; returns its req_id (undefined when not connected). */
  request(cursors: Array<[string, number]>, limit: number): bigint | undefined;
  /** Hands messages (in order) to the app. */
  emit(messages: Message[]): void;
  /** A sync finished (ok or not). */
  finished(result: { messages: number; error?: ImError }): void;
}

interface Job {
  cursors: Map<string, number>;
  own: Set<string>;
  heldAtStart: Map<string, number>;
  seen: Set<string>;
  settled: Set<string>;
  lastPage: string[];
  paceMs: number;
  emitted: number;
  reqId: bigint | undefined;
  timer: ReturnType<typeof setTimeout> | undefined;
}

/** Runs syncs over the host's connection. */
export class SyncEngine {
  private job: Job | undefined;
  private again = false;
  private waiters: Array<{ resolve: () => void; reject: (e: ImError) => void }> = [];
  private nextWaiters: Array<{ resolve: () => void; reject: (e: ImError) => void }> = [];

  /** @param tracker - the seq tracker. @param host - the client side. */
  constructor(
    private readonly tracker: SeqTracker,
    private readonly host: SyncHost,
  ) {}

  /** Whether a sync is running. */
  get running(): boolean {
    return this.job !== undefined;
  }

  /**
   * Starts a sync (or queues one after the running one). Resolves when a sync that
   * started after this call completes.
   */
  request(): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.job) {
        this.again = true;
        this.nextWaiters.push({ resolve, reject });
      } else {
        this.waiters.push({ resolve, reject });
        this.start();
      }
    });
  }

  /** Starts a background sync unless one runs already (then one more is queued). */
  kick(): void {
    if (this.job) this.again = true;
    else this.start();
  }

  private start(): void {
    const job: Job = {
      cursors: new Map(),
      own: new Set(),
      heldAtStart: new Map(),
      seen: new Set(),
      settled: new Set(),
      lastPage: [],
      paceMs: 0,
      emitted: 0,
      reqId: undefined,
      timer: undefined,
    };
    for (const [conv, delivered, top] of this.tracker.holes()) {
      if (delivered > 0 && job.own.size < MAX_SYNC_CURSORS) {
        job.cursors.set(conv, delivered);
        job.own.add(conv);
      }
      job.heldAtStart.set(conv, top);
    }
    this.job = job;
    this.sendPage(job);
  }

  private sendPage(job: Job): void {
    if (job.paceMs > 0 && job.timer === undefined) {
      job.timer = setTimeout(() => {
        job.timer = undefined;
        if (this.job === job) this.sendNow(job);
      }, job.paceMs);
      return;
    }
    this.sendNow(job);
  }

  private sendNow(job: Job): void {
    let cursors = [...job.cursors.entries()];
    if (cursors.length > MAX_SYNC_CURSORS) {
      cursors = cursors.filter(([c]) => job.own.has(c) || job.lastPage.includes(c)).slice(0, MAX_SYNC_CURSORS);
    }
    job.reqId = this.host.request(cursors, SYNC_LIMIT);
    // Not connected: the sync ends here; the next connect starts a new one.
    if (job.reqId === undefined) this.abort();
  }

  /** Whether `reqId` is the running sync's page request. @param reqId - a req_id. */
  owns(reqId: bigint): boolean {
    return this.job?.reqId === reqId;
  }

  /** A page arrived. @param messages - the page (converted). @param more - more pages wait. */
  onPage(messages: Message[], more: boolean): void {
    const job = this.job;
    if (!job) return;
    job.reqId = undefined;
    const pageConvs: string[] = [];
    for (const m of messages) {
      const conv = m.conversationId;
      if (pageConvs[pageConvs.length - 1] !== conv) pageConvs.push(conv);
      if (!job.seen.has(conv)) {
        job.seen.add(conv);
        // First seq of this conversation in the sync, read from our own cursor or (no
        // baseline yet) from the stored one: the seqs between are not there for us.
        if (job.own.has(conv) || this.tracker.delivered(conv) === 0) {
          job.settled.add(conv);
          this.emit(job, this.tracker.settle(conv, Math.max(0, m.seq - 1)));
        }
      }
      job.cursors.set(conv, Math.max(job.cursors.get(conv) ?? 0, m.seq));
      const arrival = this.tracker.arrive(m);
      // Read from a stored cursor ahead of what the app has (another device acked it):
      // fill from our own cursor next time.
      if (arrival.gap) this.again = true;
      this.emit(job, arrival.ready);
    }
    if (more && messages.length > 0) {
      job.lastPage = pageConvs;
      this.sendPage(job);
      return;
    }
    if (!more) this.settleHeld(job);
    this.finish();
  }

  /** Complete: a conversation read from an authoritative cursor has no hole left below what was held at start. */
  private settleHeld(job: Job): void {
    for (const [conv, top] of job.heldAtStart) {
      const authoritative =
        job.own.has(conv) || job.settled.has(conv) || (!job.seen.has(conv) && this.tracker.delivered(conv) === 0);
      if (authoritative) this.emit(job, this.tracker.settle(conv, top));
    }
  }

  /** The page request was refused. @param err - the server's error. */
  onError(err: ServerError): void {
    const job = this.job;
    if (!job) return;
    job.reqId = undefined;
    if (err.code === "RATE_LIMITED") {
      const wait = Math.min(1000, Math.max(1, err.retryAfterMs));
      job.paceMs = Math.min(1000, Math.max(job.paceMs * 2, wait + wait / 4));
      this.sendPage(job);
      return;
    }
    const named =
      err.code === "NOT_MEMBER" ? [...job.cursors.keys()].find((c) => err.serverMessage.endsWith(` ${c}`)) : undefined;
    if (named === undefined) {
      this.finish(err);
      return;
    }
    // A group we left while seqs were held there: its hole can no longer be filled.
    job.cursors.delete(named);
    job.own.delete(named);
    job.heldAtStart.delete(named);
    const top = this.tracker.holes().find(([c]) => c === named)?.[2] ?? 0;
    this.emit(job, this.tracker.settle(named, top));
    this.sendPage(job);
  }

  private emit(job: Job, ready: Message[]): void {
    if (ready.length === 0) return;
    job.emitted += ready.length;
    this.host.emit(ready);
  }

  private finish(error?: ImError): void {
    const job = this.job;
    this.job = undefined;
    if (job?.timer !== undefined) clearTimeout(job.timer);
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) {
      if (error) w.reject(error);
      else w.resolve();
    }
    this.host.finished(error ? { messages: job?.emitted ?? 0, error } : { messages: job?.emitted ?? 0 });
    if (this.again) {
      this.again = false;
      this.waiters = this.nextWaiters;
      this.nextWaiters = [];
      this.start();
    }
  }

  /** The running sync failed without an answer (timeout). @param err - the reason. */
  fail(err: ImError): void {
    if (this.job) this.finish(err);
  }

  /** The connection is gone: the running sync ends (its waiters keep waiting for the next connect's sync). */
  abort(): void {
    const job = this.job;
    if (!job) return;
    if (job.timer !== undefined) clearTimeout(job.timer);
    this.job = undefined;
    this.waiters.push(...this.nextWaiters);
    this.nextWaiters = [];
    this.again = false;
  }

  /** The client closed: every waiter fails. @param err - the reason. */
  close(err: ImError): void {
    this.abort();
    for (const w of [...this.waiters, ...this.nextWaiters]) w.reject(err);
    this.waiters = [];
    this.nextWaiters = [];
  }
}
