// The web chat's static file server: serves the built dist/ folder on 127.0.0.1 with
// Node's http module and nothing else. `npm run serve` runs it (port from PORT, default
// 8080); the browser tests start it in-process through `startStatic`.
import { createServer } from "node:http";
import { readFile, stat } from "node:fs/promises";
import { extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
/** The folder served by default: web-chat/dist. */
export const DIST = resolve(here, "..", "dist");

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".map": "application/json; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
};

/** Maps a request path to a file under root, or null when it leaves root or is malformed. */
export function fileFor(root, urlPath) {
  let path;
  try {
    path = decodeURIComponent(new URL(urlPath, "http://x").pathname);
  } catch {
    return null;
  }
  if (path.includes("\0")) return null;
  if (path.endsWith("/")) path += "index.html";
  const full = normalize(join(root, path));
  return full === root || full.startsWith(root + sep) ? full : null;
}

async function answer(root, req, res) {
  if (req.method !== "GET" && req.method !== "HEAD") {
    res.writeHead(405, { allow: "GET, HEAD" }).end("method not allowed\n");
    return;
  }
  const file = fileFor(root, req.url ?? "/");
  const info = file ? await stat(file).catch(() => null) : null;
  if (!file || !info || !info.isFile()) {
    res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
    return;
  }
  const body = await readFile(file);
  res.writeHead(200, {
    "content-type": TYPES[extname(file)] ?? "application/octet-stream",
    "content-length": body.length,
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
    // The app talks only to itself and to the chat server's WebSocket.
    "content-security-policy":
      "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; object-src 'none'",
  });
  res.end(req.method === "HEAD" ? undefined : body);
}

/** Starts serving `root` on host:port (port 0: a free one); resolves to { server, url }. */
export function startStatic({ root = DIST, host = "127.0.0.1", port = 0 } = {}) {
  const server = createServer((req, res) => {
    answer(root, req, res).catch((err) => {
      if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" });
      res.end(`error: ${err instanceof Error ? err.message : String(err)}\n`);
    });
  });
  return new Promise((ok, fail) => {
    server.once("error", fail);
    server.listen(port, host, () => {
      const addr = server.address();
      const p = typeof addr === "object" && addr ? addr.port : port;
      ok({ server, url: `http://${host}:${p}/` });
    });
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const raw = process.env.PORT ?? "8080";
  const port = Number(raw);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`serve: PORT must be a port number, got ${JSON.stringify(raw)}`);
    process.exit(2);
  }
  startStatic({ port }).then(
    ({ url }) => console.log(`serving ${DIST} at ${url}`),
    (err) => {
      console.error(`serve: ${err instanceof Error ? err.message : String(err)}`);
      process.exit(1);
    },
  );
}
