// The sandbox's service worker: a page loaded once keeps working when the server is gone (a
// workshop's laptop closed, a train without network). Every same-origin GET goes to the
// network first — so a rebuilt module is never served stale — and its answer is kept; when
// the network fails, the kept answer is used. The page's shell is kept at install, the
// WebGPU and real-model modules and the model file once they have been fetched.
const CACHE = 'napkin-sandbox-v1';
const SHELL = ['./', './index.html', './main.js', './style.css', './worker.js',
  './napkin_web.js', './napkin_web_bg.wasm'];

self.addEventListener('install', (event) => {
  event.waitUntil(caches.open(CACHE).then((cache) => cache.addAll(SHELL)).then(() => self.skipWaiting()));
});

self.addEventListener('activate', (event) => {
  event.waitUntil(caches.keys()
    .then((keys) => Promise.all(keys.filter((k) => k !== CACHE).map((k) => caches.delete(k))))
    .then(() => self.clients.claim()));
});

self.addEventListener('fetch', (event) => {
  const request = event.request;
  // Byte ranges and other origins pass through untouched (the CSP allows no other origin).
  if (request.method !== 'GET' || request.headers.has('range') ||
      new URL(request.url).origin !== self.location.origin) {
    return;
  }
  event.respondWith((async () => {
    const cache = await caches.open(CACHE);
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
