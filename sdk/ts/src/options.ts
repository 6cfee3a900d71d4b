/**
 * Client options and their defaults, checked once when the client is made.
 * @module
 */

import type { OutboxStore } from "./store.js";

/** The part of the WebSocket API the SDK uses (browser's, or the `ws` package's). */
export interface WebSocketLike {
  /** "arraybuffer" is set by the SDK. */
  binaryType: string;
  /** 0 connecting, 1 open, 2 closing, 3 closed. */
  readonly readyState: number;
  /** Sends one binary message. */
  send(data: Uint8Array): void;
  /** Starts the close handshake. */
  close(code?: number, reason?: string): void;
  /** Called once open. */
  onopen: ((ev: unknown) => void) | null;
  /** Called per message. */
  onmessage: ((ev: { data: unknown }) => void) | null;
  /** Called once closed, with the close code and reason. */
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  /** Called on an error (a close follows). */
  onerror: ((ev: unknown) => void) | null;
}

/** A WebSocket constructor: the browser's `WebSocket`, or `WebSocket` from `ws` in Node. */
export type WebSocketConstructor = new (url: string) => WebSocketLike;

/** Options of {@link Client}. Only `url` and a token (or `getToken`) are required. */
export interface ClientOptions {
  /** WebSocket URL of a node, `ws://host:port/ws` or `wss://...`. */
  url: string;
  /** The JWT to log in with. Optional when `getToken` is given. */
  token?: string;
  /**
   * Token provider: called for the first token when `token` is absent, before the
   * current token's `exp` (the new one is sent as a fresh Login on the open
   * connection), and after a close 4003 (expired or revoked) before reconnecting.
   */
  getToken?: () => Promise<string>;
  /** Names this device (Login.device_id); empty: the server's "default". */
  deviceId?: string;
  /**
   * Base URL of `GET /v1/route` (`http://host:port`). Default: derived from `url`
   * (ws to http, wss to https). `null` turns routing off: always connect to `url`.
   * When the route call fails, the SDK connects to `url`.
   */
  routeUrl?: string | null;
  /** WebSocket implementation. Default: `globalThis.WebSocket` (browsers, Node 22+). */
  webSocket?: WebSocketConstructor;
  /** First reconnect delay ceiling, ms (default 500). */
  reconnectMinMs?: number;
  /** Largest reconnect delay, ms (default 30000). */
  reconnectMaxMs?: number;
  /** How long a request waits for its answer, ms (default 15000). */
  requestTimeoutMs?: number;
  /** How long connect + login may take, ms (default 10000). */
  connectTimeoutMs?: number;
  /** Most unacknowledged sends the outbox holds (default 1000). */
  outboxMax?: number;
  /** Where the outbox keeps entries (default: in memory). */
  outboxStore?: OutboxStore;
  /** How long DeliverAcks are collected before they go out, ms (default 100). */
  ackDelayMs?: number;
  /** Largest payload accepted by send/edit, bytes (default 60 KiB; the server's frame cap is 64 KiB). */
  maxPayloadBytes?: number;
  /** How often `typing(conv, true)` is actually sent per conversation, ms (default 3000). */
  typingIntervalMs?: number;
  /** Heartbeat interval override, ms (default: the server's LoginOk.heartbeat_secs). */
  heartbeatMs?: number;
  /** Refresh the token this long before its exp, ms (default: a third of its remaining life, at most 60000). */
  refreshBeforeExpMs?: number;
  /**
   * Follow the browser's network state (default: true where `window` `online`/`offline`
   * events and `navigator.onLine` exist): on `offline` the socket is closed and reconnect
   * attempts wait; on `online` the client reconnects at once. Sends stay in the outbox.
   */
  watchNetwork?: boolean;
}

/** Options with defaults filled in. */
export interface ResolvedOptions {
  /** See {@link ClientOptions}. */
  url: string;
  /** See {@link ClientOptions}. */
  token: string | undefined;
  /** See {@link ClientOptions}. */
  getToken: (() => Promise<string>) | undefined;
  /** See {@link ClientOptions}. */
  deviceId: string;
  /** Resolved route base URL, or undefined when routing is off. */
  routeUrl: string | undefined;
  /** See {@link ClientOptions}. */
  webSocket: WebSocketConstructor;
  /** See {@link ClientOptions}. */
  reconnectMinMs: number;
  /** See {@link ClientOptions}. */
  reconnectMaxMs: number;
  /** See {@link ClientOptions}. */
  requestTimeoutMs: number;
  /** See {@link ClientOptions}. */
  connectTimeoutMs: number;
  /** See {@link ClientOptions}. */
  outboxMax: number;
  /** See {@link ClientOptions}. */
  outboxStore: OutboxStore | undefined;
  /** See {@link ClientOptions}. */
  ackDelayMs: number;
  /** See {@link ClientOptions}. */
  maxPayloadBytes: number;
  /** See {@link ClientOptions}. */
  typingIntervalMs: number;
  /** See {@link ClientOptions}. */
  heartbeatMs: number | undefined;
  /** See {@link ClientOptions}. */
  refreshBeforeExpMs: number | undefined;
  /** See {@link ClientOptions}. */
  watchNetwork: boolean;
}
