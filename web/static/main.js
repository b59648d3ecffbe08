// Loads the WebAssembly module and renders the app; records the time to first render.
import init, { start } from './napkin_web.js';

await init();
start();
requestAnimationFrame(() => {
  window.napkinFirstRenderMs = performance.now();
  document.body.dataset.ready = 'true';
});
