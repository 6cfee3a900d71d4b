// Types of serve.mjs, the static file server (for the TypeScript tests that start it).
import type { Server } from "node:http";

/** The folder served by default: web-chat/dist. */
export const DIST: string;
/** Maps a request path to a file under root, or null when it leaves root or is malformed. */
export function fileFor(root: string, urlPath: string): string | null;
/** Starts serving `root` on host:port (port 0: a free one). */
export function startStatic(opts?: { root?: string; host?: string; port?: number }): Promise<{ server: Server; url: string }>;
