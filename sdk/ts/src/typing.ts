/**
 * Typing throttle: keeps `Typing` frames within what the server accepts
 * (`limits.typing_rate_per_sec` 2, `limits.typing_burst` 10 by default) and what
 * receivers need (a `true` every few seconds while typing, one `false` at the stop).
 * @module
 */

/** Server default typing rate, frames per second. */
export const TYPING_RATE_PER_SEC = 2;
/** Server default typing burst. */
export const TYPING_BURST = 10;

/** Decides which typing calls become frames. */
export class TypingThrottle {
  private readonly lastTrue = new Map<string, number>();
  private tokens = TYPING_BURST;
  private refilled = 0;

  /** @param intervalMs - least time between two `true` frames of one conversation. */
  constructor(private readonly intervalMs: number) {}

  /**
   * Whether a frame should go out now (and takes a token when it does).
   * @param conv - conversation. @param typing - typing or stopped. @param now - ms.
   */
  allow(conv: string, typing: boolean, now: number): boolean {
    const last = this.lastTrue.get(conv);
    if (typing && last !== undefined && now - last < this.intervalMs) return false;
    if (!typing && last === undefined) return false;
    if (!this.take(now)) return false;
    if (typing) this.lastTrue.set(conv, now);
    else this.lastTrue.delete(conv);
    return true;
  }

  private take(now: number): boolean {
    if (this.refilled === 0) this.refilled = now;
    this.tokens = Math.min(TYPING_BURST, this.tokens + ((now - this.refilled) / 1000) * TYPING_RATE_PER_SEC);
    this.refilled = now;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}
