/**
 * Outbox persistence: the {@link OutboxStore} interface, an in-memory store, and an
 * IndexedDB store for browsers so unacknowledged sends survive a page reload.
 * @module
 */

import type { MessageType, Target } from "./types.js";

/** One unacknowledged operation waiting in the outbox, keyed by its client_msg_id. */
export type OutboxEntry =
  | {
      /** A message. */
      readonly op: "send";
      /** Idempotency id (a UUID), the same on every resend. */
      readonly clientMsgId: string;
      /** Where it goes. */
      readonly target: Target;
      /** Message kind. */
      readonly type: MessageType;
      /** Payload bytes. */
      readonly payload: Uint8Array;
      /** When it was queued, ms. */
      readonly createdAt: number;
    }
  | {
      /** Recall of a message. */
      readonly op: "recall";
      /** Idempotency id. */
      readonly clientMsgId: string;
      /** The message's conversation. */
      readonly conversationId: string;
      /** The message's seq. */
      readonly seq: number;
      /** The message's id. */
      readonly msgId: string;
      /** When it was queued, ms. */
      readonly createdAt: number;
    }
  | {
      /** Edit of a message. */
      readonly op: "edit";
      /** Idempotency id. */
      readonly clientMsgId: string;
      /** The message's conversation. */
      readonly conversationId: string;
      /** The message's seq. */
      readonly seq: number;
      /** The message's id. */
      readonly msgId: string;
      /** The new payload. */
      readonly payload: Uint8Array;
      /** When it was queued, ms. */
      readonly createdAt: number;
    };

/**
 * Where the outbox keeps unacknowledged entries. The SDK calls `put` before an entry is
 * first sent and `delete` once it is acknowledged (or refused for good); `load` once,
 * when the client starts, to resend what a previous run left.
 */
export interface OutboxStore {
  /** Every stored entry, oldest first. */
  load(): Promise<OutboxEntry[]>;
  /** Stores (or replaces) an entry. */
  put(entry: OutboxEntry): Promise<void>;
  /** Removes the entry with this client_msg_id (no error when absent). */
  delete(clientMsgId: string): Promise<void>;
}

/** An {@link OutboxStore} in memory: survives reconnects, not a restart. */
export class MemoryOutboxStore implements OutboxStore {
  private readonly entries = new Map<string, OutboxEntry>();

  /** {@inheritDoc OutboxStore.load} */
  load(): Promise<OutboxEntry[]> {
    return Promise.resolve([...this.entries.values()].sort((a, b) => a.createdAt - b.createdAt));
  }

  /** {@inheritDoc OutboxStore.put} */
  put(entry: OutboxEntry): Promise<void> {
    this.entries.set(entry.clientMsgId, entry);
    return Promise.resolve();
  }

  /** {@inheritDoc OutboxStore.delete} */
  delete(clientMsgId: string): Promise<void> {
    this.entries.delete(clientMsgId);
    return Promise.resolve();
  }
}

/** Minimal structural view of the IndexedDB factory (so no DOM lib is needed to compile). */
export interface IdbFactoryLike {
  /** Opens (or creates) a database. */
  open(name: string, version?: number): unknown;
}

type Req<T> = {
  result: T;
  error: unknown;
  onsuccess: (() => void) | null;
  onerror: (() => void) | null;
};
type Store = {
  getAll(): Req<OutboxEntry[]>;
  put(v: OutboxEntry): Req<unknown>;
  delete(k: string): Req<unknown>;
};
type Db = {
  objectStoreNames: { contains(n: string): boolean };
  createObjectStore(n: string, o: { keyPath: string }): unknown;
  transaction(n: string, mode: "readonly" | "readwrite"): { objectStore(n: string): Store };
};

const STORE = "outbox";

function done<T>(r: Req<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

/**
 * An {@link OutboxStore} in the browser's IndexedDB: unsent messages survive a page
 * reload. One database per user is advisable (`im-outbox-<userId>`).
 */
export class IndexedDbOutboxStore implements OutboxStore {
  private db: Promise<Db> | undefined;

  /**
   * @param dbName - the IndexedDB database name.
   * @param factory - the IndexedDB factory (default: `globalThis.indexedDB`).
   */
  constructor(
    private readonly dbName = "im-outbox",
    private readonly factory?: IdbFactoryLike,
  ) {}

  private open(): Promise<Db> {
    if (this.db) return this.db;
    const f = this.factory ?? (globalThis as { indexedDB?: IdbFactoryLike }).indexedDB;
    if (!f) return Promise.reject(new Error("IndexedDB is not available here"));
    const req = f.open(this.dbName, 1) as Req<Db> & { onupgradeneeded: (() => void) | null };
    req.onupgradeneeded = () => {
      if (!req.result.objectStoreNames.contains(STORE)) {
        req.result.createObjectStore(STORE, { keyPath: "clientMsgId" });
      }
    };
    this.db = done(req);
    return this.db;
  }

  private async store(mode: "readonly" | "readwrite"): Promise<Store> {
    return (await this.open()).transaction(STORE, mode).objectStore(STORE);
  }

  /** {@inheritDoc OutboxStore.load} */
  async load(): Promise<OutboxEntry[]> {
    const all = await done((await this.store("readonly")).getAll());
    return all.sort((a, b) => a.createdAt - b.createdAt);
  }

  /** {@inheritDoc OutboxStore.put} */
  async put(entry: OutboxEntry): Promise<void> {
    await done((await this.store("readwrite")).put(entry));
  }

  /** {@inheritDoc OutboxStore.delete} */
  async delete(clientMsgId: string): Promise<void> {
    await done((await this.store("readwrite")).delete(clientMsgId));
  }
}
