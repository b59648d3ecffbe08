// Loads the WebAssembly module and renders the app; records the time to first render; registers
// the service worker that keeps the page working offline (sw.js).
import init, { start } from './napkin_web.js';

if ('serviceWorker' in navigator) {
  navigator.serviceWorker.register('./sw.js').catch((error) => {
    console.warn(`napkin: no offline copy (${error})`);
  });
}

await init();
start();
requestAnimationFrame(() => {
  window.napkinFirstRenderMs = performance.now();
  document.body.dataset.ready = 'true';
});
