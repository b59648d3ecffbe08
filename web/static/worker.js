// The training worker, off the main thread. Messages in: a JSON TrainRequest (the tiny
// presets), or { job: 'teach', request, file?, name?, url?, backend? } for the real-model mode (the GGUF is
// fetched from the sandbox's server unless the page sends a file the learner picked). Messages
// out: JSON TrainEvents. CPU runs use the page's own WebAssembly module; a WebGPU run fetches
// the second, larger module (burn wgpu; it also holds the real-model mode) the first time one
// is asked for, the real-model mode on the CPU a third (the GGUF reader, tokenizer and chat
// templates).
import init, { train_in_worker } from './napkin_web.js';

const ready = init();
let gpuModule = null;
let teachModule = null;

const post = (event) => self.postMessage(event);
const failed = (message) => post(JSON.stringify({ event: 'failed', message }));
const progress = (what, loaded, total) =>
  post(JSON.stringify({ event: 'downloading', what, loaded, total: total || null }));

/**
 * A file's bytes with `downloading` events as they arrive (every 4 MB, and once at the end
 * with the total); null (and a `failed` event naming what to do) when the server has none.
 * A compressed response's length is not the file's: the total is then unknown until the end.
 */
async function fetchBytes(url, what, missing) {
  const response = await fetch(url);
  if (!response.ok) {
    failed(`${missing} (${url}: HTTP ${response.status})`);
    return null;
  }
  const length = Number(response.headers.get('Content-Length')) || 0;
  const total = response.headers.get('Content-Encoding') ? 0 : length;
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
      progress(what, loaded, total);
      reported = loaded;
    }
  }
  progress(what, loaded, loaded);
  const bytes = new Uint8Array(loaded);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  return bytes;
}

/**
 * A wasm-bindgen module loaded on demand: its glue imported, its wasm fetched with progress.
 * The names are written out in full: scripts/ci/web-build.sh rewrites them to the content-hashed
 * names of the build.
 */
async function loadModule(gluePath, wasmPath, what, hint) {
  let glue;
  try {
    glue = await import(gluePath);
  } catch (error) {
    failed(`this build has no ${what} (${gluePath}; ${hint}): ${error}`);
    return null;
  }
  const bytes = await fetchBytes(wasmPath, what, `this build has no ${what} (${hint})`);
  if (!bytes) return null;
  await glue.default({ module_or_path: bytes });
  return glue;
}

/**
 * The WebGPU adapter in words and the WebGPU module (loaded the first time); null (and a
 * `failed` event saying why) when this browser has no WebGPU or the build has no module.
 */
async function webGpu() {
  if (!navigator.gpu) {
    failed('this browser offers no WebGPU (navigator.gpu is missing); train on the CPU instead');
    return null;
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) {
    failed('this browser found no WebGPU adapter; train on the CPU instead');
    return null;
  }
  const info = adapter.info ?? {};
  const name = [info.vendor, info.architecture, info.description].filter(Boolean).join(' ');
  if (!gpuModule) {
    gpuModule = await loadModule('./napkin_web_gpu.js', './napkin_web_gpu_bg.wasm', 'the WebGPU module',
      'scripts/ci/web-build.sh skips it with NAPKIN_WEBGPU=0');
    if (!gpuModule) return null;
  }
  return { adapter: name || 'unnamed', module: gpuModule };
}

async function trainOnWebGpu(json) {
  const gpu = await webGpu();
  if (gpu) await gpu.module.train_on_webgpu(json, gpu.adapter, post);
}

/** The real-model mode: on WebGPU through the WebGPU module (built with it), else on the CPU. */
async function teach({ request, file, name, url, backend }) {
  let gpu = null;
  if (backend === 'web_gpu') {
    gpu = await webGpu();
    if (!gpu) return;
  } else if (!teachModule) {
    teachModule = await loadModule('./napkin_web_teach.js', './napkin_web_teach_bg.wasm',
      'the real-model module',
      'scripts/ci/web-build.sh builds it');
    if (!teachModule) return;
  }
  let bytes;
  if (file) {
    bytes = new Uint8Array(file);
    progress('the model', bytes.length, bytes.length);
  } else {
    bytes = await fetchBytes(url, 'the model', 'the sandbox server has no model file: run ' +
      'scripts/fetch/smollm2.sh and rebuild with scripts/ci/web-build.sh, or pick the .gguf file from disk');
    if (!bytes) return;
  }
  if (gpu) {
    await gpu.module.teach_on_webgpu(request, name, bytes, gpu.adapter, post);
  } else {
    await teachModule.teach_in_worker(request, name, bytes, post);
  }
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
