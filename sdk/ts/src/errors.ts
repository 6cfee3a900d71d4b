/**
 * Typed errors of the SDK. Every error the SDK raises or emits is an {@link ImError};
 * `kind` tells them apart without `instanceof` (a discriminated union over
 * {@link ImErrorKind}), and {@link ServerError} carries the server's `ErrorCode`.
 * @module
 */

/** The server's error codes (the names of `im.v1.ErrorCode`). */
export type ServerErrorCode =
  | "UNSPECIFIED"
  | "UNAUTHENTICATED"
  | "BAD_FRAME"
  | "TOO_LARGE"
  | "RATE_LIMITED"
  | "NOT_MEMBER"
  | "OVERLOADED"
  | "NOT_FOUND"
  | "INTERNAL"
  | "FORBIDDEN"
  | "REJECTED_BY_HOOK"
  | "REGION_UNAVAILABLE";

/** The prefix of the server's message for a Send its before-send hook rejected. */
const HOOK_PREFIX = "rejected by the before-send hook";

/** What went wrong, one name per error class. */
export type ImErrorKind =
  | "invalid_argument"
  | "config"
  | "server"
  | "login_refused"
  | "kicked"
  | "token_expired"
  | "disconnected"
  | "timeout"
  | "outbox_full"
  | "client_closed"
  | "protocol";

/** Base class of every SDK error. */
export abstract class ImError extends Error {
  /** Which error this is. */
  abstract readonly kind: ImErrorKind;
  /** @param message - a sentence saying what went wrong. */
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** An argument was refused before anything was sent (bad id, empty text, too large...). */
export class InvalidArgumentError extends ImError {
  /** Discriminant. */
  readonly kind = "invalid_argument" as const;
  /**
   * @param argument - the name of the refused argument.
   * @param message - why it was refused.
   */
  constructor(readonly argument: string, message: string) {
    super(`${argument}: ${message}`);
  }
}

/** The client's options cannot work (bad URL, no WebSocket implementation, ...). */
export class ConfigError extends ImError {
  /** Discriminant. */
  readonly kind = "config" as const;
}

/** The server answered a request with an `Error` frame. */
export class ServerError extends ImError {
  /** Discriminant. */
  readonly kind = "server" as const;
  /**
   * @param code - the server's error code.
   * @param serverMessage - the server's message.
   * @param retryAfterMs - RATE_LIMITED and OVERLOADED: how long to wait before retrying.
   */
  constructor(
    readonly code: ServerErrorCode,
    readonly serverMessage: string,
    readonly retryAfterMs: number,
  ) {
    super(`${code}: ${serverMessage}`);
  }

  /**
   * REJECTED_BY_HOOK: the operator's before-send hook refused the message (nothing was
   * stored; resending the same content is refused again). Its reason, written for the
   * sender (at most 256 bytes, possibly empty); `undefined` for any other code.
   */
  get hookReason(): string | undefined {
    if (this.code !== "REJECTED_BY_HOOK") return undefined;
    const m = this.serverMessage;
    if (m.startsWith(`${HOOK_PREFIX}: `)) return m.slice(HOOK_PREFIX.length + 2);
    return m === HOOK_PREFIX ? "" : m;
  }
}

/**
 * The server refused the login (bad or expired token and no fresh one, another user's
 * token, too many sessions kept refusing). Terminal: the client is closed.
 */
export class LoginRefusedError extends ImError {
  /** Discriminant. */
  readonly kind = "login_refused" as const;
  /**
   * @param code - the WebSocket close code (or 0 when the socket was not closed).
   * @param reason - the server's reason.
   */
  constructor(readonly code: number, readonly reason: string) {
    super(`login refused (close ${code}): ${reason}`);
  }
}

/** The operator closed this session (close 4002). Terminal: the client is closed. */
export class KickedError extends ImError {
  /** Discriminant. */
  readonly kind = "kicked" as const;
  /** @param reason - the server's close reason. */
  constructor(readonly reason: string) {
    super(`kicked: ${reason}`);
  }
}

/** The token expired or was revoked (close 4003) and no token provider could renew it. */
export class TokenExpiredError extends ImError {
  /** Discriminant. */
  readonly kind = "token_expired" as const;
}

/** The connection was lost while the request was in flight (it may have been applied). */
export class DisconnectedError extends ImError {
  /** Discriminant. */
  readonly kind = "disconnected" as const;
}

/** No answer within the request timeout. */
export class TimeoutError extends ImError {
  /** Discriminant. */
  readonly kind = "timeout" as const;
}

/** The outbox holds its maximum of unacknowledged sends; the send was not queued. */
export class OutboxFullError extends ImError {
  /** Discriminant. */
  readonly kind = "outbox_full" as const;
  /** @param max - the outbox bound. */
  constructor(readonly max: number) {
    super(`outbox full: ${max} unacknowledged sends`);
  }
}

/** The client was closed (by `close()` or a terminal error) before the request finished. */
export class ClientClosedError extends ImError {
  /** Discriminant. */
  readonly kind = "client_closed" as const;
}

/** The server sent something the SDK cannot use (an undecodable frame, a wrong reply). */
export class ProtocolError extends ImError {
  /** Discriminant. */
  readonly kind = "protocol" as const;
}

/** Every concrete SDK error, as a union to `switch` on `kind`. */
export type AnyImError =
  | InvalidArgumentError
  | ConfigError
  | ServerError
  | LoginRefusedError
  | KickedError
  | TokenExpiredError
  | DisconnectedError
  | TimeoutError
  | OutboxFullError
  | ClientClosedError
  | ProtocolError;
