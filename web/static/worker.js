// The training worker, off the main thread. Messages in: a JSON TrainRequest. Messages out:
// JSON TrainEvents. CPU runs use the page's own WebAssembly module; a WebGPU run fetches the
// second, larger module (burn wgpu) the first time one is asked for.
import init, { train_in_worker } from './napkin_web.js';

const ready = init();
let gpuModule = null;

const post = (event) => self.postMessage(event);
const failed = (message) => post(JSON.stringify({ event: 'failed', message }));

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

self.onmessage = async (message) => {
  try {
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
