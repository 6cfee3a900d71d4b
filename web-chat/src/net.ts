/**
 * A WebSocket that follows the browser's network state, given to the SDK as its
 * `webSocket` implementation. Browsers can report the network gone (`offline`, and
 * `navigator.onLine` false) while an open WebSocket lingers, or keeps working, as under
 * DevTools' offline emulation. Here `offline` closes every open socket at once and a
 * socket made while offline fails at once, so the SDK sees a real disconnect, keeps its
 * outbox, and reconnects (after `online`) on its own schedule.
 */
import type { WebSocketConstructor, WebSocketLike } from "im-sdk";

/** The close code reported when the network went away (as for an abnormal close). */
export const OFFLINE_CLOSE_CODE = 1006;

const CLOSED = 3;

/** Open sockets, to close on `offline`. */
const live = new Set<NetworkSocket>();

/** A browser WebSocket that closes when the network goes offline. */
class NetworkSocket implements WebSocketLike {
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  private ws: WebSocket | null = null;
  private type: BinaryType = "blob";

  constructor(url: string) {
    if (!navigator.onLine) {
      // Fail like a socket that cannot connect: error, then close, after the caller
      // has set its handlers.
      setTimeout(() => this.report("network offline"), 0);
      return;
    }
    const ws = new WebSocket(url);
    this.ws = ws;
    live.add(this);
    ws.onopen = (ev) => this.onopen?.(ev);
    ws.onmessage = (ev) => this.onmessage?.(ev);
    ws.onerror = (ev) => this.onerror?.(ev);
    ws.onclose = (ev) => {
      live.delete(this);
      this.onclose?.({ code: ev.code, reason: ev.reason });
    };
  }

  get binaryType(): string {
    return this.ws?.binaryType ?? this.type;
  }

  set binaryType(t: string) {
    this.type = t === "arraybuffer" ? "arraybuffer" : "blob";
    if (this.ws) this.ws.binaryType = this.type;
  }

  get readyState(): number {
    return this.ws?.readyState ?? CLOSED;
  }

  send(data: Uint8Array): void {
    if (!this.ws) throw new Error("the socket is closed (network offline)");
    this.ws.send(data);
  }

  close(code?: number, reason?: string): void {
    this.ws?.close(code, reason);
  }

  /** The network went away: drop the socket now and report it closed. */
  cut(): void {
    const ws = this.ws;
    if (!ws) return;
    this.ws = null;
    live.delete(this);
    ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
    ws.close();
    this.report("network offline");
  }

  private report(reason: string): void {
    this.onerror?.({ type: "error", reason });
    this.onclose?.({ code: OFFLINE_CLOSE_CODE, reason });
  }
}

/** The WebSocket constructor to give the SDK (call {@link watchNetwork} first). */
export const NetworkWebSocket: WebSocketConstructor = NetworkSocket;

let watching = false;

/**
 * Starts closing sockets on `offline` (once per page) and calls `onChange` at each
 * `offline`/`online`; returns the function that stops calling it.
 */
export function watchNetwork(onChange: (online: boolean) => void): () => void {
  if (!watching) {
    watching = true;
    window.addEventListener("offline", () => {
      for (const s of [...live]) s.cut();
    });
  }
  const off = (): void => onChange(false);
  const on = (): void => onChange(true);
  window.addEventListener("offline", off);
  window.addEventListener("online", on);
  return () => {
    window.removeEventListener("offline", off);
    window.removeEventListener("online", on);
  };
}
