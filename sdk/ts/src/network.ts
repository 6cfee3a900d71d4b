/**
 * The browser's network state (`online`/`offline` events, `navigator.onLine`), when the
 * platform has it; the engine closes the socket while offline and reconnects at once
 * when the network is back.
 * @module
 */

/** The window-like target of online/offline events. */
export interface NetworkWatch {
  /** Whether the browser thinks it is online. */
  online(): boolean;
  /** Calls `fn(online)` on each change; returns the unsubscribe function. */
  subscribe(fn: (online: boolean) => void): () => void;
}

/** The browser's network state, or undefined outside a browser. */
export function browserNetwork(): NetworkWatch | undefined {
  const g = globalThis as {
    addEventListener?: (t: string, f: () => void) => void;
    removeEventListener?: (t: string, f: () => void) => void;
    navigator?: { onLine?: boolean };
  };
  const add = g.addEventListener;
  const remove = g.removeEventListener;
  if (typeof add !== "function" || typeof remove !== "function" || typeof g.navigator?.onLine !== "boolean") return undefined;
  return {
    online: () => g.navigator?.onLine !== false,
    subscribe: (fn) => {
      const on = (): void => fn(true);
      const off = (): void => fn(false);
      add.call(g, "online", on);
      add.call(g, "offline", off);
      return () => {
        remove.call(g, "online", on);
        remove.call(g, "offline", off);
      };
    },
  };
}
