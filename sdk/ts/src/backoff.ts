/**
 * Reconnect backoff: exponential with full jitter (each delay uniformly in
 * `[0, min(max, min * 2^attempt)]`), and the retry delay after RATE_LIMITED/OVERLOADED.
 * @module
 */

/** Exponential backoff with full jitter. */
export class Backoff {
  private attempt = 0;

  /**
   * @param minMs - ceiling of the first delay.
   * @param maxMs - largest ceiling.
   * @param random - uniform source in [0, 1) (tests pass their own).
   */
  constructor(
    private readonly minMs: number,
    private readonly maxMs: number,
    private readonly random: () => number = Math.random,
  ) {}

  /** The ceiling of the next delay. */
  ceiling(): number {
    return Math.min(this.maxMs, this.minMs * 2 ** Math.min(this.attempt, 30));
  }

  /** The next delay (grows the ceiling for the one after). */
  next(): number {
    const d = Math.floor(this.random() * (this.ceiling() + 1));
    this.attempt += 1;
    return d;
  }

  /** Attempts made since the last reset. */
  get attempts(): number {
    return this.attempt;
  }

  /** Back to the first delay (after a connection that stayed up). */
  reset(): void {
    this.attempt = 0;
  }
}

/**
 * Wait before retrying after RATE_LIMITED or OVERLOADED: `retryAfterMs` (at least 1 ms)
 * plus up to 25% jitter, so many clients do not retry in lockstep.
 * @param retryAfterMs - the server's hint. @param random - uniform source in [0, 1).
 */
export function retryDelay(retryAfterMs: number, random: () => number = Math.random): number {
  const base = Math.max(1, retryAfterMs);
  return Math.ceil(base + random() * base * 0.25);
}
