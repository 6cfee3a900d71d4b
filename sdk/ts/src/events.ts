/**
 * The client's typed events: connection state changes and what the server pushes.
 * @module
 */

import type { ImError } from "./errors.js";
import type { Message, Presence, ReadReceipt, SendAck, Session, Typing } from "./types.js";

/** The connection state machine: disconnected -> connecting -> connected -> ... -> closed. */
export type ConnectionState = "disconnected" | "connecting" | "connected" | "closed";

/** Events of {@link Client}, by name, with their payloads. */
export interface ClientEvents {
  /** Any state change. */
  state: { state: ConnectionState; previous: ConnectionState };
  /** A connection attempt starts (after `delayMs` of backoff). */
  connecting: { attempt: number; delayMs: number };
  /** Logged in; sync and outbox resend follow. */
  connected: Session & { url: string };
  /** The connection ended; `willReconnect` tells whether the client tries again. */
  disconnected: { code: number; reason: string; willReconnect: boolean };
  /** Terminal: the client stopped (by `close()`, or for `error`). */
  closed: { error?: ImError };
  /**
   * A message for the app: each exactly once, in seq order per conversation (live pushes
   * and sync alike). Own sends are not echoed (their ack says where they went), but
   * messages sent from the user's other devices are.
   */
  message: Message;
  /** Someone read a conversation. */
  receipt: ReadReceipt;
  /** A watched user's presence. */
  presence: Presence;
  /** Someone is typing (or stopped). */
  typing: Typing;
  /** An outbox entry is stored in the outbox store (it survives a reload from now on). */
  queued: { clientMsgId: string };
  /** An outbox entry was acknowledged (also for entries reloaded from the store). */
  acked: SendAck;
  /** An outbox entry was refused for good (not retried), with the server's error. */
  sendFailed: { clientMsgId: string; error: ImError };
  /** A sync (after a connect, a gap or a hint) finished. */
  synced: { messages: number };
  /** The token was renewed on the open connection. */
  tokenRefreshed: { exp: number | undefined };
  /** A non-fatal problem worth logging (an unexpected server error, a failed background sync). */
  error: ImError;
}
