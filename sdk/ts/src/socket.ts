/**
 * One WebSocket connection: opens it (with a timeout), sends encoded frames, decodes
 * each binary message into frames (Batch unwrapped) and reports the close once.
 * @module
 */

import { decodeFrames, encodeFrame, type Body, type pb } from "./convert.js";
import type { WebSocketConstructor, WebSocketLike } from "./options.js";

/** Close code the SDK uses when it gives up a connection itself (dead, timed out). */
export const CLIENT_GONE = 4000;

/** What the socket reports to its owner. */
export interface SocketHandler {
  /** Frames of one message, in order. */
  frames(frames: pb.Frame[]): void;
  /** A message that did not decode. */
  undecodable(error: unknown): void;
  /** The connection ended (reported once). */
  closed(code: number, reason: string): void;
}

/** An open WebSocket speaking im.v1 frames. */
export class Socket {
  private done = false;

  private constructor(
    private readonly ws: WebSocketLike,
    private handler: SocketHandler,
  ) {}

  /**
   * Opens a WebSocket to `url`; resolves once open, rejects on error, close or timeout.
   * @param ctor - the WebSocket implementation. @param url - where. @param timeoutMs - limit.
   * @param handler - receives frames and the close.
   */
  static open(ctor: WebSocketConstructor, url: string, timeoutMs: number, handler: SocketHandler): Promise<Socket> {
    return new Promise((resolve, reject) => {
      let ws: WebSocketLike;
      try {
        ws = new ctor(url);
      } catch (e) {
        reject(e instanceof Error ? e : new Error(String(e)));
        return;
      }
      ws.binaryType = "arraybuffer";
      const s = new Socket(ws, handler);
      let opened = false;
      const timer = setTimeout(() => {
        s.done = true;
        s.close(CLIENT_GONE, "connect timeout");
        reject(new Error(`connect to ${url} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      ws.onopen = () => {
        clearTimeout(timer);
        opened = true;
        resolve(s);
      };
      ws.onerror = () => undefined;
      ws.onclose = (ev) => {
        clearTimeout(timer);
        if (opened) {
          s.finish(ev.code, ev.reason);
          return;
        }
        s.done = true;
        reject(new Error(`connect to ${url} failed (close ${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`));
      };
      ws.onmessage = (ev) => s.message(ev.data);
    });
  }

  private message(data: unknown): void {
    let bytes: Uint8Array;
    if (data instanceof ArrayBuffer) bytes = new Uint8Array(data);
    else if (data instanceof Uint8Array) bytes = data;
    else {
      this.handler.undecodable(new Error("text message from the server"));
      return;
    }
    let frames: pb.Frame[];
    try {
      frames = decodeFrames(bytes);
    } catch (e) {
      this.handler.undecodable(e);
      return;
    }
    this.handler.frames(frames);
  }

  private finish(code: number, reason: string): void {
    if (this.done) return;
    this.done = true;
    this.handler.closed(code, reason);
  }

  /** Whether the socket is open. */
  get open(): boolean {
    return !this.done && this.ws.readyState === 1;
  }

  /** Sends one frame; false when the socket is not open. @param reqId - request id. @param body - the body. */
  send(reqId: bigint, body: Body): boolean {
    if (!this.open) return false;
    this.ws.send(encodeFrame(reqId, body));
    return true;
  }

  /**
   * Closes the socket and reports the close at once (not waiting for the handshake).
   * @param code - close code. @param reason - close reason.
   */
  close(code: number, reason: string): void {
    try {
      this.ws.close(code === CLIENT_GONE || code === 1000 ? code : 1000, reason);
    } catch {
      // Already closing.
    }
    this.finish(code, reason);
  }
}
