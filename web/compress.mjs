// Writes `.br` (brotli) and `.gz` (gzip -9) beside each text and wasm file of a folder
// (default web/dist), for web/serve.mjs to send to browsers that accept them, or any static
// server configured to (nginx `gzip_static` / `brotli_static`). Prints each file's sizes.
// Usage: node web/compress.mjs [DIR]
import { readdirSync, readFileSync, statSync, writeFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { brotliCompressSync, constants, gzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';

const dir = process.argv[2] ?? join(fileURLToPath(new URL('.', import.meta.url)), 'dist');
const worth = /\.(wasm|js|css|html|json|svg)$/;

let plain = 0;
let br = 0;
for (const name of readdirSync(dir).sort()) {
  const path = join(dir, name);
  if (!worth.test(name) || !statSync(path).isFile()) continue;
  const body = readFileSync(path);
  const brotli = brotliCompressSync(body, {
    params: {
      [constants.BROTLI_PARAM_QUALITY]: 11,
      [constants.BROTLI_PARAM_SIZE_HINT]: body.length,
      [constants.BROTLI_PARAM_MODE]: name.endsWith('.wasm')
        ? constants.BROTLI_MODE_GENERIC : constants.BROTLI_MODE_TEXT,
    },
  });
  const gzip = gzipSync(body, { level: 9 });
  // Written under a temporary name and renamed: a server never sends half a file.
  for (const [suffix, bytes] of [['.br', brotli], ['.gz', gzip]]) {
    writeFileSync(`${path}${suffix}.part`, bytes);
    renameSync(`${path}${suffix}.part`, `${path}${suffix}`);
  }
  plain += body.length;
  br += brotli.length;
  console.log(`  ${name}: ${body.length} bytes, ${gzip.length} gzip, ${brotli.length} brotli`);
}
console.log(`compressed ${dir}: ${plain} bytes → ${br} brotli`);
