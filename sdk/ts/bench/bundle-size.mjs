// Minified and gzipped browser bundle size of im-sdk (esbuild, ESM, platform browser),
// and of centrifuge-js (JSON and protobuf builds) when its npm package is installed in
// the directory given as the first argument (outside this repository), bundled the same way.
// Usage: npm run build && node bench/bundle-size.mjs [/tmp/dir-with-node_modules/centrifuge]
import { build } from "esbuild";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

async function size(name, source, resolveDir) {
  const out = await build({
    stdin: { contents: source, resolveDir, loader: "js" },
    bundle: true,
    minify: true,
    format: "esm",
    platform: "browser",
    write: false,
  });
  const bytes = out.outputFiles[0].contents;
  console.log(`${name.padEnd(28)} ${String(bytes.length).padStart(8)} B min  ${String(gzipSync(bytes, { level: 9 }).length).padStart(7)} B gzip`);
}

await size("im-sdk (Client)", `import { Client } from "./dist/index.js"; globalThis.C = Client;`, root);
await size("  of it @bufbuild/protobuf", `import { create, toBinary, fromBinary } from "@bufbuild/protobuf"; globalThis.C = [create, toBinary, fromBinary];`, root);
const cf = process.argv[2];
if (cf) {
  await size("centrifuge (JSON)", `import { Centrifuge } from "centrifuge"; globalThis.C = Centrifuge;`, cf);
  await size("centrifuge (protobuf)", `import { Centrifuge } from "centrifuge/build/protobuf"; globalThis.C = Centrifuge;`, cf);
}
