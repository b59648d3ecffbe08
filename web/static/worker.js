// The training worker, off the main thread. Messages in: a JSON TrainRequest (the tiny
// presets), or { job: 'teach', request, file?, name? } for the real-model mode (the GGUF is
// fetched from the sandbox's server unless the page sends a file the learner picked). Messages
// out: JSON TrainEvents. CPU runs use the page's own WebAssembly module; a WebGPU run fetches
// the second, larger module (burn wgpu) the first time one is asked for, the real-model mode a
// third (the GGUF reader, tokenizer and chat templates).
import init, { train_in_worker } from './napkin_web.js';

const ready = init();
let gpuModule = null;
let teachModule = null;

const post = (event) => self.postMessage(event);
const failed = (message) => post(JSON.stringify({ event: 'failed', message }));
const progress = (loaded, total) =>
  post(JSON.stringify({ event: 'downloading', loaded, total: total || null }));

async function trainOnWebGpu(json) {
  if (!navigator.gpu) {
    failed('this browser offers no WebGPU (navigator.gpu is missing); train on the CPU instead');
    return;
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) {
    failed('this browser found no WebGPU adapter; train on the CPU instead');
    return;
  }
  const info = adapter.info ?? {};
  const name = [info.vendor, info.architecture, info.description].filter(Boolean).join(' ');
  if (!gpuModule) {
    try {
      gpuModule = await import('./napkin_web_gpu.js');
    } catch (error) {
      failed(`this build has no WebGPU module (scripts/web-build.sh skips it with NAPKIN_WEBGPU=0): ${error}`);
      return;
    }
    await gpuModule.default();
  }
  await gpuModule.train_on_webgpu(json, name || 'unnamed', post);
}

/** The model file from the server, with progress events; null (and a `failed` event) if not. */
async function download(url) {
  const response = await fetch(url);
  if (!response.ok) {
    failed(`the sandbox server has no ${url} (HTTP ${response.status}): run scripts/fetch-smollm2.sh ` +
      'and rebuild with scripts/web-build.sh, or pick the .gguf file from disk');
    return null;
  }
  const total = Number(response.headers.get('Content-Length')) || 0;
  const chunks = [];
  let loaded = 0;
  let reported = 0;
  const reader = response.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    loaded += value.length;
    if (loaded - reported >= (1 << 22)) {
      progress(loaded, total);
      reported = loaded;
    }
  }
  progress(loaded, total);
  const bytes = new Uint8Array(loaded);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  return bytes;
}

async function teach({ request, file, name, url }) {
  if (!teachModule) {
    try {
      teachModule = await import('./napkin_web_teach.js');
    } catch (error) {
      failed(`this build has no real-model module (napkin_web_teach.js): ${error}`);
      return;
    }
    await teachModule.default();
  }
  let bytes;
  if (file) {
    bytes = new Uint8Array(file);
    progress(bytes.length, bytes.length);
  } else {
    bytes = await download(url);
    if (!bytes) return;
  }
  await teachModule.teach_in_worker(request, name, bytes, post);
}

self.onmessage = async (message) => {
  try {
    if (typeof message.data === 'object' && message.data.job === 'teach') {
      await teach(message.data);
      return;
    }
    const json = message.data;
    if (JSON.parse(json).backend === 'web_gpu') {
      await trainOnWebGpu(json);
    } else {
      await ready;
      await train_in_worker(json, post);
    }
  } catch (error) {
    failed(`the worker crashed: ${error}`);
  }
};
