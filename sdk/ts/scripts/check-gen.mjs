// Regenerates the protobuf code from proto/im/v1/im.proto into a temp dir and fails when
// it differs from the committed src/gen (which is never edited by hand).
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const bin = join(root, "node_modules", ".bin");
const tmp = mkdtempSync(join(tmpdir(), "im-sdk-gen-"));

function files(dir) {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? files(p) : [p];
  });
}

try {
  const template = join(tmp, "buf.gen.yaml");
  const yaml = readFileSync(join(root, "buf.gen.yaml"), "utf8").replace(/out: src\/gen/, `out: ${join(tmp, "gen")}`);
  writeFileSync(template, yaml);
  execFileSync(join(bin, "buf"), [
    "generate",
    join(root, "..", "..", "proto"),
    // The released contract kept for `scripts/check-wire` is not generated.
    "--exclude-path",
    join(root, "..", "..", "proto", "released"),
    "--template",
    template,
  ], {
    cwd: root,
    stdio: "inherit",
    env: { ...process.env, PATH: `${bin}:${process.env.PATH}` },
  });
  const want = files(join(tmp, "gen")).map((p) => relative(join(tmp, "gen"), p)).sort();
  const have = files(join(root, "src", "gen")).map((p) => relative(join(root, "src", "gen"), p)).sort();
  const diff = [];
  if (want.join("\n") !== have.join("\n")) diff.push(`file sets differ: generated [${want}] committed [${have}]`);
  for (const f of want) {
    if (have.includes(f) && readFileSync(join(tmp, "gen", f), "utf8") !== readFileSync(join(root, "src", "gen", f), "utf8")) {
      diff.push(`${f} differs`);
    }
  }
  if (diff.length) {
    console.error(`src/gen is stale (run \`npm run generate\`):\n  ${diff.join("\n  ")}`);
    process.exit(1);
  }
  console.log("src/gen matches proto/im/v1/im.proto");
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
