// The sandbox's service worker: a page loaded once keeps working when the server is gone (a
// workshop's laptop closed, a train without network). The modules carry their content's hash
// in their names (scripts/ci/web-build.sh), so a kept copy of one is always right: they are
// answered from the cache first. Every other same-origin GET goes to the network first — a
// changed page is never served stale — and its answer is kept; when the network fails, the
// kept answer is used. The page's shell is kept at install, the WebGPU and real-model modules
// and the model file once they have been fetched.
// web-build.sh names the cache after the build: a new build's worker drops the old one.
const CACHE = 'napkin-sandbox-dev';
// The model (98 MB) is kept apart, across builds.
const MODELS = 'napkin-models-v1';
const SHELL = ['./', './index.html', './main.js', './style.css', './worker.js',
  './napkin_web.js', './napkin_web_bg.wasm'];
const HASHED = /\.[0-9a-f]{12}\.(js|wasm)$/;

self.addEventListener('install', (event) => {
  event.waitUntil(caches.open(CACHE).then((cache) => cache.addAll(SHELL)).then(() => self.skipWaiting()));
});

self.addEventListener('activate', (event) => {
  event.waitUntil(caches.keys()
    .then((keys) => Promise.all(keys.filter((k) => k !== CACHE && k !== MODELS).map((k) => caches.delete(k))))
    .then(() => self.clients.claim()));
});

self.addEventListener('fetch', (event) => {
  const request = event.request;
  const url = new URL(request.url);
  // Byte ranges and other origins pass through untouched (the CSP allows no other origin).
  if (request.method !== 'GET' || request.headers.has('range') || url.origin !== self.location.origin) {
    return;
  }
  event.respondWith((async () => {
    const cache = await caches.open(url.pathname.includes('/models/') ? MODELS : CACHE);
    if (HASHED.test(url.pathname)) {
      const kept = await cache.match(request);
      if (kept) return kept;
    }
    try {
      const response = await fetch(request);
      if (response.status === 200) {
        // Kept while the page reads its own copy (the 98 MB model is not held back).
        event.waitUntil(cache.put(request, response.clone()));
      }
      return response;
    } catch (offline) {
      const kept = await cache.match(request, { ignoreSearch: true });
      if (kept) return kept;
      throw offline;
    }
  })());
});
