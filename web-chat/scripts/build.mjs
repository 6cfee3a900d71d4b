// Builds the web chat with esbuild: src/main.ts bundled into dist/app.js beside the
// static files. With --tests, bundles test/**/*.test.ts for Node's test runner into
// test-build/ instead (dependencies left as imports).
import { build } from "esbuild";
import { cp, mkdir, readdir, rm } from "node:fs/promises";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(fileURLToPath(new URL(".", import.meta.url)), "..");

async function buildApp() {
  const dist = join(root, "dist");
  await rm(dist, { recursive: true, force: true });
  await mkdir(dist, { recursive: true });
  await build({
    entryPoints: [join(root, "src", "main.ts")],
    outfile: join(dist, "app.js"),
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    minify: true,
    sourcemap: true,
    logLevel: "warning",
  });
  await cp(join(root, "static"), dist, { recursive: true });
}

async function testEntries(dir) {
  const out = [];
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...(await testEntries(p)));
    else if (e.name.endsWith(".test.ts")) out.push(p);
  }
  return out;
}

/** Tests import scripts/*.mjs where they are, so those keep their own import.meta.url. */
const keepScriptsExternal = {
  name: "keep-scripts-external",
  setup(b) {
    b.onResolve({ filter: /\/scripts\/[^/]+\.mjs$/ }, (args) => ({
      path: resolve(args.resolveDir, args.path),
      external: true,
    }));
  },
};

async function buildTests() {
  const outdir = join(root, "test-build");
  await rm(outdir, { recursive: true, force: true });
  await build({
    entryPoints: await testEntries(join(root, "test")),
    outdir,
    outbase: join(root, "test"),
    outExtension: { ".js": ".mjs" },
    bundle: true,
    format: "esm",
    platform: "node",
    target: "node20",
    packages: "external",
    plugins: [keepScriptsExternal],
    sourcemap: "inline",
    logLevel: "warning",
  });
}

try {
  await (process.argv.includes("--tests") ? buildTests() : buildApp());
} catch (err) {
  console.error(`build failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
}
