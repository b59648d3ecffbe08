// The training worker: the same WebAssembly module as the page, running the training job off
// the main thread. Messages in: a JSON TrainRequest. Messages out: JSON TrainEvents.
import init, { train_in_worker } from './napkin_web.js';

const ready = init();

self.onmessage = async (message) => {
  await ready;
  try {
    train_in_worker(message.data, (event) => self.postMessage(event));
  } catch (error) {
    self.postMessage(JSON.stringify({ event: 'failed', message: `the worker crashed: ${error}` }));
  }
};
