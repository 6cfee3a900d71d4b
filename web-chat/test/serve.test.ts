// Tests of the static file server: serves dist files with their types, refuses paths
// outside the root, and answers 404 and 405.
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileFor, startStatic } from "../scripts/serve.mjs";

test("fileFor keeps requests inside the root", () => {
  assert.equal(fileFor("/srv", "/"), "/srv/index.html");
  assert.equal(fileFor("/srv", "/app.js?x=1"), "/srv/app.js");
  assert.equal(fileFor("/srv", "/%2e%2e/etc/passwd"), "/srv/etc/passwd", "URL dot segments stay inside");
  assert.equal(fileFor("/srv", "/..%2fetc%2fpasswd"), null);
  assert.equal(fileFor("/srv", "/a/%00"), null);
  assert.equal(fileFor("/srv", "/%E0%A4%A"), null);
});

test("the server answers files, 404 and 405", async () => {
  const dir = await mkdtemp(join(tmpdir(), "web-chat-serve-"));
  await writeFile(join(dir, "index.html"), "<p>hi</p>");
  const { server, url } = await startStatic({ root: dir, port: 0 });
  try {
    const ok = await fetch(url);
    assert.equal(ok.status, 200);
    assert.match(ok.headers.get("content-type") ?? "", /text\/html/);
    assert.equal(await ok.text(), "<p>hi</p>");
    assert.equal((await fetch(new URL("missing.js", url))).status, 404);
    assert.equal((await fetch(url, { method: "POST" })).status, 405);
  } finally {
    server.closeAllConnections();
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
});
