/**
 * A small typed event emitter (no Node `events` import, so the browser bundle stays
 * free of Node built-ins). A listener that throws does not stop the others.
 * @module
 */

/** A listener of one event. */
export type Listener<T> = (payload: T) => void;

/** Emits the events of the map `E` (event name to payload type). */
export class Emitter<E extends object> {
  private readonly listeners = new Map<keyof E, Set<Listener<never>>>();

  /**
   * Adds `fn` for `event`; returns a function that removes it.
   * @param event - the event name.
   * @param fn - called with the payload each time the event happens.
   */
  on<K extends keyof E>(event: K, fn: Listener<E[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) {
      set = new Set();
      this.listeners.set(event, set);
    }
    set.add(fn as Listener<never>);
    return () => this.off(event, fn);
  }

  /**
   * Adds `fn` for the next `event` only.
   * @param event - the event name.
   * @param fn - called once.
   */
  once<K extends keyof E>(event: K, fn: Listener<E[K]>): () => void {
    const off = this.on(event, (p) => {
      off();
      fn(p);
    });
    return off;
  }

  /**
   * Removes `fn` from `event`.
   * @param event - the event name.
   * @param fn - the listener given to `on`.
   */
  off<K extends keyof E>(event: K, fn: Listener<E[K]>): void {
    this.listeners.get(event)?.delete(fn as Listener<never>);
  }

  /**
   * Calls every listener of `event` with `payload`.
   * @param event - the event name.
   * @param payload - what the listeners get.
   */
  protected emit<K extends keyof E>(event: K, payload: E[K]): void {
    const set = this.listeners.get(event);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        (fn as Listener<E[K]>)(payload);
      } catch (e) {
        // A listener's bug must not break the SDK's state; report it asynchronously.
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }
}
