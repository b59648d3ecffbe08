// Serves web/dist for one learner or a whole room: the right MIME types and the page's own
// Content-Security-Policy; the precompressed `.br` / `.gz` files web/compress.mjs writes beside
// each module, picked by the browser's Accept-Encoding; year-long caching of the modules named
// after their content's hash, ETags for the rest, so a second visit revalidates
// instead of downloading again; byte ranges. Node only, no dependencies.
// Usage: node web/serve.mjs [--host ADDR] [--port N] [N]
//   --host 127.0.0.1 (default: this machine only) or 0.0.0.0 (every interface: a workshop room;
//   the URLs learners open are printed); --port 8080 (default; 0: any free port).
import { createServer } from 'node:http';
import { open, stat } from 'node:fs/promises';
import { networkInterfaces } from 'node:os';
import { extname, join, normalize, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = fileURLToPath(new URL('.', import.meta.url));
const types = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.wasm': 'application/wasm',
  '.json': 'application/json',
};
const csp = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; " +
  "connect-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; " +
  "base-uri 'none'; form-action 'none'";
// The encodings web/compress.mjs writes, best first.
const encodings = [['br', '.br'], ['gzip', '.gz']];

/** The precompressed sibling of `file` the request accepts, if there is one as new as it. */
async function compressed(file, accept, identity) {
  const accepted = new Set(accept.split(',').map((e) => e.split(';')[0].trim().toLowerCase()));
  for (const [name, suffix] of encodings) {
    if (!accepted.has(name)) continue;
    try {
      const s = await stat(file + suffix);
      if (s.isFile() && s.mtimeMs >= identity.mtimeMs) return { name, path: file + suffix, size: s.size };
    } catch {
      // no such file: try the next encoding
    }
  }
  return null;
}

/**
 * A module named after its content's hash (web-build.sh: `napkin_web_bg.<12 hex>.wasm`) never
 * changes: browsers keep it a year without asking. Everything else is revalidated every time
 * (an unchanged file costs a 304): the page that names the modules is never stale.
 */
export function cacheControl(file) {
  return /\.[0-9a-f]{12}\.(js|wasm)$/.test(file) ? 'public, max-age=31536000, immutable' : 'no-cache';
}

/** `bytes=a-b` (one range) against a file of `size` bytes: [start, end] inclusive, or null. */
function range(header, size) {
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === '' && m[2] === '')) return null;
  let start; let end;
  if (m[1] === '') {
    start = Math.max(0, size - Number(m[2]));
    end = size - 1;
  } else {
    start = Number(m[1]);
    end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  }
  return start <= end && start < size ? [start, end] : null;
}

async function send(res, path, status, headers, start, end, head) {
  res.writeHead(status, { ...headers, 'Content-Length': end - start + 1 });
  if (head || end < start) {
    res.end();
    return;
  }
  const handle = await open(path);
  const stream = handle.createReadStream({ start, end });
  // A client that goes away mid-file (a learner's Stop during the model download) must not
  // leave the file open.
  res.once('close', () => stream.destroy());
  stream.pipe(res);
}

/**
 * Starts the server: `serve(port)` as before, or `serve(port, { host, root })`.
 * Resolves to the listening `http.Server`.
 */
export function serve(port = 0, { host = '127.0.0.1', root = join(here, 'dist') } = {}) {
  const server = createServer(async (req, res) => {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { Allow: 'GET, HEAD' }).end();
      return;
    }
    const path = decodeURIComponent(new URL(req.url, 'http://localhost').pathname);
    const file = normalize(join(root, path === '/' ? 'index.html' : path));
    if (file !== root && !file.startsWith(root + sep)) {
      res.writeHead(403).end();
      return;
    }
    let identity;
    try {
      identity = await stat(file);
      if (!identity.isFile()) throw new Error('not a file');
    } catch {
      res.writeHead(404).end('not found');
      return;
    }
    const etag = `"${identity.size.toString(36)}-${Math.floor(identity.mtimeMs).toString(36)}"`;
    const headers = {
      'Content-Type': types[extname(file)] ?? 'application/octet-stream',
      'Content-Security-Policy': csp,
      'Cache-Control': cacheControl(file),
      ETag: etag,
      Vary: 'Accept-Encoding',
      'Accept-Ranges': 'bytes',
    };
    const head = req.method === 'HEAD';
    if (req.headers['if-none-match'] === etag) {
      res.writeHead(304, headers).end();
      return;
    }
    if (req.headers.range) {
      const r = range(req.headers.range, identity.size);
      if (!r) {
        res.writeHead(416, { 'Content-Range': `bytes */${identity.size}` }).end();
        return;
      }
      headers['Content-Range'] = `bytes ${r[0]}-${r[1]}/${identity.size}`;
      await send(res, file, 206, headers, r[0], r[1], head);
      return;
    }
    const packed = await compressed(file, String(req.headers['accept-encoding'] ?? ''), identity);
    if (packed) {
      headers['Content-Encoding'] = packed.name;
      await send(res, packed.path, 200, headers, 0, packed.size - 1, head);
      return;
    }
    await send(res, file, 200, headers, 0, identity.size - 1, head);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve(server));
  });
}

/** The URLs a learner can open: the host itself, or every IPv4 address when it is 0.0.0.0. */
export function urls(host, port) {
  if (host !== '0.0.0.0' && host !== '::') return [`http://${host}:${port}/`];
  const addresses = Object.values(networkInterfaces()).flat()
    .filter((a) => a && a.family === 'IPv4')
    .map((a) => a.address);
  return addresses.map((a) => `http://${a}:${port}/`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  let host = '127.0.0.1';
  let port = 8080;
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--host') host = args[++i];
    else if (args[i] === '--port') port = Number(args[++i]);
    else if (/^\d+$/.test(args[i])) port = Number(args[i]);
    else {
      console.error(`error: unknown argument ${args[i]} (usage: node web/serve.mjs [--host ADDR] [--port N])`);
      process.exit(2);
    }
  }
  if (!Number.isInteger(port) || port < 0 || port > 65535 || !host) {
    console.error('error: --port takes 0–65535 and --host an address (127.0.0.1, 0.0.0.0, …)');
    process.exit(2);
  }
  let server;
  try {
    server = await serve(port, { host });
  } catch (e) {
    console.error(`error: cannot listen on ${host}:${port}: ${e.message}`);
    process.exit(1);
  }
  const links = urls(host, server.address().port);
  console.log(`napkin sandbox (Ctrl-C stops); open:\n  ${links.join('\n  ')}`);
}
