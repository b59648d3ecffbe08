// The sandbox server as a workshop uses it, without a browser: bound to another loopback
// address (127.0.0.2, never outside the machine); precompressed brotli / gzip by
// Accept-Encoding, byte-identical once decoded; year-long caching for content-hashed names only; ETag revalidation (304); byte ranges (206,
// 416); nothing outside the folder (403 / 404); the command line prints the URL to open.
// Usage: node web/e2e/serve.test.mjs
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { brotliDecompressSync, gunzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';
import { serve } from '../serve.mjs';

const web = fileURLToPath(new URL('..', import.meta.url));
const root = mkdtempSync(join(tmpdir(), 'napkin-serve-'));
const module = Buffer.from('(module) '.repeat(20000)); // compressible, like a wasm module
writeFileSync(join(root, 'app_bg.wasm'), module);
writeFileSync(join(root, 'index.html'), '<!doctype html><title>napkin</title>');
const hashedName = 'app_bg.0123456789ab.wasm';
writeFileSync(join(root, hashedName), module);
writeFileSync(join(root, '..', `secret-${process.pid}`), 'not for learners');
execFileSync(process.execPath, [join(web, 'compress.mjs'), root], { stdio: 'ignore' });

const host = '127.0.0.2';
const server = await serve(0, { host, root });
const port = server.address().port;
function get(path, headers = {}, method = 'GET') {
  return new Promise((resolve, reject) => {
    const req = request({ host, port, path, method, headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end();
  });
}

const br = await get('/app_bg.wasm', { 'accept-encoding': 'gzip, deflate, br' });
assert.equal(br.status, 200);
assert.equal(br.headers['content-encoding'], 'br');
assert.equal(br.headers['content-type'], 'application/wasm');
assert.equal(br.headers.vary, 'Accept-Encoding');
assert.ok(br.headers['content-security-policy'].startsWith("default-src 'self'"));
assert.deepEqual(brotliDecompressSync(br.body), module);
assert.ok(br.body.length * 20 < module.length, `brotli ${br.body.length} of ${module.length} bytes`);

const gz = await get('/app_bg.wasm', { 'accept-encoding': 'gzip' });
assert.equal(gz.headers['content-encoding'], 'gzip');
assert.deepEqual(gunzipSync(gz.body), module);

const plain = await get('/app_bg.wasm');
assert.equal(plain.headers['content-encoding'], undefined);
assert.deepEqual(plain.body, module);

const again = await get('/app_bg.wasm', { 'if-none-match': plain.headers.etag, 'accept-encoding': 'br' });
assert.equal(again.status, 304);
assert.equal(again.body.length, 0);

const part = await get('/app_bg.wasm', { range: 'bytes=10-19' });
assert.equal(part.status, 206);
assert.equal(part.headers['content-range'], `bytes 10-19/${module.length}`);
assert.deepEqual(part.body, module.subarray(10, 20));
const tail = await get('/app_bg.wasm', { range: 'bytes=-5' });
assert.deepEqual(tail.body, module.subarray(module.length - 5));
assert.equal((await get('/app_bg.wasm', { range: `bytes=${module.length}-` })).status, 416);

const index = await get('/');
assert.equal(index.headers['content-type'], 'text/html; charset=utf-8');
// A content-hashed module is kept for a year; the page that names it is revalidated.
assert.equal(index.headers['cache-control'], 'no-cache');
assert.equal(plain.headers['cache-control'], 'no-cache');
const hashed = await get(`/${hashedName}`, { 'accept-encoding': 'br' });
assert.equal(hashed.headers['cache-control'], 'public, max-age=31536000, immutable');
assert.equal(hashed.headers['content-encoding'], 'br');
for (const path of [`/../secret-${process.pid}`, `/%2e%2e/secret-${process.pid}`,
  `/..%2fsecret-${process.pid}`, `/%2e%2e%2fsecret-${process.pid}`]) {
  const outside = await get(path);
  assert.ok([403, 404].includes(outside.status), `${path}: ${outside.status}`);
  assert.ok(!outside.body.toString().includes('not for learners'), path);
}
assert.equal((await get('/missing.js')).status, 404);
assert.equal((await get('/', {}, 'POST')).status, 405);
const head = await get('/app_bg.wasm', {}, 'HEAD');
assert.equal(Number(head.headers['content-length']), module.length);
assert.equal(head.body.length, 0);
server.close();

// The command line: --host and --port, and the URL learners open.
const cli = spawn(process.execPath, [join(web, 'serve.mjs'), '--host', host, '--port', '0']);
const printed = await new Promise((resolve) => {
  let out = '';
  cli.stdout.on('data', (d) => {
    out += d;
    if (out.includes('http://')) resolve(out);
  });
});
cli.kill();
assert.match(printed, /http:\/\/127\.0\.0\.2:\d+\//);
const refused = spawn(process.execPath, [join(web, 'serve.mjs'), '--port', 'x']);
assert.equal(await new Promise((resolve) => refused.on('exit', resolve)), 2);

rmSync(root, { recursive: true });
rmSync(join(root, '..', `secret-${process.pid}`));
console.log(`serve: brotli ${br.body.length} / gzip ${gz.body.length} / plain ${module.length} bytes; 304, 206, 416, 405 and nothing outside the folder, as expected`);
