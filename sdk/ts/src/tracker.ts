/**
 * `SeqTracker`: per-conversation delivery cursors and the messages held above a gap
 * (the same invariant as the Rust SDK's tracker).
 *
 * Conversation C's message with seq n reaches the app only once the app has had seq
 * n-1 (or n is the first after the cursor the SDK starts from). Per conversation the
 * tracker keeps `delivered` (the last seq handed to the app in order, or settled as not
 * there for this user) and the seqs that arrived above it (live messages, and our own
 * messages known from their SendAck, which are never emitted). A seq at or below
 * `delivered`, or already held, is a duplicate. Holes are closed only by the next seq
 * arriving or by {@link SeqTracker.settle}, which the sync engine calls with what a sync
 * from an authoritative cursor proved. Conversations whose `delivered` moved (or that
 * saw duplicates: the server's cursor lags) are marked dirty, so a DeliverAck for
 * `delivered` (never more) goes out for them.
 * @module
 */

import type { Message } from "./types.js";

/** Most seqs held above a hole per conversation; past it the hole is given up. */
export const MAX_HELD = 65_536;

/** What one arrival did. */
export interface Arrival {
  /** Messages the app may have now, in seq order. */
  ready: Message[];
  /** The arrival is held above a hole: a sync should fill it. */
  gap: boolean;
}

class Conv {
  delivered = 0;
  /** Held seqs, ascending; `msgs` has the message (null: our own). */
  seqs: number[] = [];
  msgs = new Map<number, Message | null>();

  hold(seq: number, m: Message | null): void {
    let lo = 0;
    let hi = this.seqs.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((this.seqs[mid] as number) < seq) lo = mid + 1;
      else hi = mid;
    }
    this.seqs.splice(lo, 0, seq);
    this.msgs.set(seq, m);
  }

  private take(ready: Message[]): void {
    const seq = this.seqs.shift() as number;
    const m = this.msgs.get(seq);
    this.msgs.delete(seq);
    this.delivered = seq;
    if (m) ready.push(m);
  }

  /** Moves `delivered` over the held seqs that follow it. */
  release(ready: Message[]): void {
    while (this.seqs.length > 0 && this.seqs[0] === this.delivered + 1) this.take(ready);
  }

  /** Releases everything held up to `upto`, declares `upto` delivered, releases what follows. */
  settle(upto: number, ready: Message[]): void {
    while (this.seqs.length > 0 && (this.seqs[0] as number) <= upto) this.take(ready);
    this.delivered = Math.max(this.delivered, upto);
    this.release(ready);
  }
}

/** Delivery state for all conversations this client has seen. */
export class SeqTracker {
  private readonly convs = new Map<string, Conv>();
  private readonly dirty = new Set<string>();

  private conv(id: string): Conv {
    let c = this.convs.get(id);
    if (!c) {
      c = new Conv();
      this.convs.set(id, c);
    }
    return c;
  }

  /** A message arrived (live or in a sync page): what the app may have now. @param m - the message. */
  arrive(m: Message): Arrival {
    if (m.seq === 0) return { ready: [m], gap: false };
    return this.record(m.conversationId, m.seq, m);
  }

  /**
   * Our own message `seq` in `conv` is committed (its SendAck): never emitted, but it
   * takes its place in the order. @param conv - conversation. @param seq - its seq.
   */
  own(conv: string, seq: number): Arrival {
    if (seq === 0) return { ready: [], gap: false };
    return this.record(conv, seq, null);
  }

  private record(id: string, seq: number, m: Message | null): Arrival {
    const c = this.conv(id);
    const out: Arrival = { ready: [], gap: false };
    if (seq <= c.delivered || c.msgs.has(seq)) {
      if (c.delivered > 0) this.dirty.add(id);
      return out;
    }
    if (seq === c.delivered + 1) {
      c.delivered = seq;
      if (m) out.ready.push(m);
      c.release(out.ready);
    } else {
      c.hold(seq, m);
      out.gap = true;
      if (c.seqs.length > MAX_HELD) c.settle((c.seqs[0] as number) - 1, out.ready);
    }
    if (out.ready.length > 0 || !out.gap) this.dirty.add(id);
    return out;
  }

  /**
   * Declares everything up to `upto` in `conv` settled (a sync proved the seqs never seen
   * are not there for this user); returns what the app may have now. Never moves back.
   * @param conv - conversation. @param upto - settled up to here.
   */
  settle(conv: string, upto: number): Message[] {
    const ready: Message[] = [];
    const c = this.conv(conv);
    if (upto <= c.delivered) return ready;
    c.settle(upto, ready);
    this.dirty.add(conv);
    return ready;
  }

  /** Last seq of `conv` the app has in order (0: none yet). @param conv - conversation. */
  delivered(conv: string): number {
    return this.convs.get(conv)?.delivered ?? 0;
  }

  /** Conversations with seqs held above a hole: [conversation, delivered, highest held]. */
  holes(): Array<[string, number, number]> {
    const out: Array<[string, number, number]> = [];
    for (const [id, c] of this.convs) {
      if (c.seqs.length > 0) out.push([id, c.delivered, c.seqs[c.seqs.length - 1] as number]);
    }
    return out;
  }

  /** Whether any conversation holds seqs above a hole. */
  hasHeld(): boolean {
    for (const c of this.convs.values()) if (c.seqs.length > 0) return true;
    return false;
  }

  /** The DeliverAcks due: (conversation, delivered) of the dirty conversations. */
  takeAcks(): Array<[string, number]> {
    const out: Array<[string, number]> = [];
    for (const id of this.dirty) {
      const d = this.delivered(id);
      if (d > 0) out.push([id, d]);
    }
    this.dirty.clear();
    return out;
  }
}
