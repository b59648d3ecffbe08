// End-to-end test of the sandbox in real headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core; no browser download). Serves web/dist, then checks: the page
// renders; turning NF4 on lowers a block's predicted weight bytes by the ratio napkin math
// gives; checkpointing draws each block's recomputed activations as an outline, with the
// numbers `napkin estimate --json` gives; DPO's reference forward appears in the timeline;
// a run in the page trains a tiny Llama with falling losses and shows measured
// per-layer numbers beside the predictions; a dropped config.json and a `napkin measure`
// report and a `napkin train` run's metrics.jsonl load (its curves drawn with axes); the
// exercise mode checks an answer; no request leaves 127.0.0.1 and the CSP
// blocks one that tries. With the WebGPU module built, the same run on WebGPU (Chromium's
// SwiftShader adapter, offered with --enable-unsafe-webgpu) gives the CPU run's losses.
// Writes artifacts/sandbox.png and artifacts/e2e-report.json.
//
// Usage: node sandbox.test.mjs
//   (env: CHROMIUM, NAPKIN_MEASURE_JSON, NAPKIN_ESTIMATE_JSON, NAPKIN_CONFIG_JSON, NAPKIN_METRICS_JSONL, NAPKIN_WEBGPU=0
//   without that module)
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtemp, mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { serve } from '../serve.mjs';

const here = fileURLToPath(new URL('.', import.meta.url));
// WebGPU and the CPU sum in other orders (f32): the 20 losses agreed to 4 decimals on
// Chromium 156's SwiftShader adapter; a relative 1e-3 leaves room for other adapters.
const WEBGPU_LOSS_TOLERANCE = 1e-3;
const artifacts = join(here, 'artifacts');
await mkdir(artifacts, { recursive: true });

// Every module's name carries the first 12 hex digits of its content's SHA-256, and the
// names the page loads by are those files (web-build.sh rewrote them).
const dist = join(here, '..', 'dist');
const hashedFiles = (await readdir(dist)).filter((f) => /\.[0-9a-f]{12}\.(js|wasm)$/.test(f));
assert.ok(hashedFiles.some((f) => /^napkin_web_bg\./.test(f)), `no hashed page module in ${dist}`);
for (const f of hashedFiles) {
  const digest = createHash('sha256').update(await readFile(join(dist, f))).digest('hex');
  assert.equal(f.split('.').at(-2), digest.slice(0, 12), `${f}: its name is not its content's hash`);
}
for (const f of ['main.js', 'worker.js', 'sw.js']) {
  const text = await readFile(join(dist, f), 'utf8');
  for (const named of text.matchAll(/\.\/(napkin_web[a-z_]*(?:\.[0-9a-f]{12})?\.(?:js|wasm))/g)) {
    // Built with NAPKIN_WEBGPU=0, the worker still names the WebGPU module it would fetch.
    if (process.env.NAPKIN_WEBGPU === '0' && named[1].startsWith('napkin_web_gpu')) continue;
    assert.ok(hashedFiles.includes(named[1]), `${f} names ${named[1]}, which the build does not hold`);
  }
}

const server = await serve(0);
const origin = `http://127.0.0.1:${server.address().port}`;
const profile = await mkdtemp(join(tmpdir(), 'napkin-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--enable-unsafe-webgpu'],
});
const withWebGpu = process.env.NAPKIN_WEBGPU !== '0';
// The files scripts/ci/test-web.sh writes for the imports: without them the checks that read
// them would not run, so their absence fails the test rather than passing it quietly.
for (const name of ['NAPKIN_MEASURE_JSON', 'NAPKIN_ESTIMATE_JSON', 'NAPKIN_CONFIG_JSON', 'NAPKIN_METRICS_JSONL']) {
  assert.ok(process.env[name], `${name} is not set: run this test through scripts/ci/test-web.sh`);
}
const report = {};
const step = (name) => console.log(`e2e: ${name}`);

try {
  const requests = [];
  context.on('request', (r) => requests.push(r.url()));
  // How the page's module travels: the browser accepts brotli, the server sends its copy.
  const moduleEncodings = [];
  // Every response's transferred bytes (headers and body as sent, compressed where it was).
  const transfers = [];
  context.on('response', (r) => {
    transfers.push(r.request().sizes().then((z) => z.responseHeadersSize + z.responseBodySize, () => 0));
    if (/\/napkin_web_bg\.[0-9a-f]{12}\.wasm$/.test(r.url())) {
      const seen = { encoding: r.headers()['content-encoding'], cache: r.headers()['cache-control'] };
      moduleEncodings.push(seen);
      r.request().sizes().then((sizes) => { seen.bytes = sizes.responseBodySize; }, () => {});
    }
  });
  const page = context.pages()[0] ?? await context.newPage();
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));

  step('the page loads and renders');
  const t0 = Date.now();
  await page.goto(`${origin}/`);
  await page.waitForSelector('body[data-ready="true"]', { timeout: 60_000 });
  await page.waitForSelector('#controls');
  report.first_render_ms = await page.evaluate(() => window.napkinFirstRenderMs);
  assert.equal(moduleEncodings[0]?.encoding, 'br', 'the page module is sent brotli-compressed');
  assert.equal(moduleEncodings[0]?.cache, 'public, max-age=31536000, immutable',
    'the content-hashed module is cached for a year');
  report.module_bytes_transferred = moduleEncodings[0]?.bytes;
  report.load_wall_ms = Date.now() - t0;
  // A first visit: everything fetched until the page is ready (the service worker's own copy
  // of the shell included, which a browser fetches right after).
  report.first_visit_bytes = (await Promise.all(transfers)).reduce((a, b) => a + b, 0);
  report.first_visit_requests = transfers.length;
  assert.match(await page.textContent('#peak'), /Step peak/);

  step('every chart has its numbers in a table, and no memory kind is told by colour alone');
  // The timeline's table: its largest row is the event the chart marks as the peak.
  const events = await page.$$eval('#timeline-table tbody tr', (trs) => trs.map((tr) =>
    [tr.querySelector('th').textContent, Number(tr.dataset.bytes)]));
  assert.ok(events.length > 4, `timeline rows ${events.length}`);
  const largest = events.reduce((a, b) => (b[1] > a[1] ? b : a));
  assert.match(await page.textContent('#timeline-chart'), new RegExp(`peak .* at ${largest[0].replace(/\./g, '\\.')}`));
  assert.equal(await page.$$eval('#layer-table tbody tr', (trs) => trs.length),
    await page.$$eval('g.layer', (gs) => gs.length), 'one layer-table row per bar');
  // Each hatched kind's overlay names a pattern the chart defines, and the legend's swatches
  // carry hatches that differ from one another.
  const hatches = await page.$$eval('#layer-chart rect.hatch', (rects) => rects.map((r) =>
    [r.dataset.kind, !!document.querySelector(r.getAttribute('fill').slice(4, -1) + ' line')]));
  assert.ok(hatches.length > 0 && hatches.every(([, defined]) => defined), JSON.stringify(hatches));
  const swatches = await page.$$eval('#layer-chart ~ .legend .swatch', (spans) =>
    spans.map((s) => getComputedStyle(s).backgroundImage));
  const hatched = swatches.filter((b) => b !== 'none');
  assert.equal(hatched.length, 5, `hatched legend swatches ${JSON.stringify(swatches)}`);
  assert.equal(new Set(hatched).size, 5, 'each hatched kind its own hatch');

  step('NF4 lowers a block\'s weights by napkin math\'s ratio');
  const block = async () => page.$eval('g.layer[data-layer="layers.0"]',
    (g) => Number(g.dataset.weights) + Number(g.dataset.quant));
  const before = await block();
  await page.check('#nf4');
  await page.waitForFunction((b) => {
    const g = document.querySelector('g.layer[data-layer="layers.0"]');
    return Number(g.dataset.weights) + Number(g.dataset.quant) !== b;
  }, before);
  const after = await block();
  // SmolLM2-135M block: 3,538,944 linear weights (q, k, v, o, gate, up, down) and 2 × 576 norm
  // weights. f32: 4 B each. NF4: 4 bits per weight plus one f32 absmax per 64 weights; the
  // norms stay f32.
  const linear = 576 * (576 + 2 * 192) + 576 * 576 + 3 * 576 * 1536;
  const norms = 2 * 576;
  const expected = (linear * (0.5 + 4 / 64) + 4 * norms) / (4 * (linear + norms));
  report.nf4_block_ratio = after / before;
  report.nf4_block_ratio_expected = expected;
  assert.ok(Math.abs(after / before - expected) < 0.01 * expected,
    `NF4 ratio ${after / before} vs ${expected}`);
  await page.uncheck('#nf4');

  step('the PyTorch profile appears beside the prediction on request');
  await page.check('#compare-pytorch');
  await page.waitForSelector('#pytorch');
  assert.match(await page.textContent('#pytorch'), /In PyTorch .* allocated/);
  assert.match(await page.textContent('#pytorch'), /reserved by the caching allocator/);
  await page.uncheck('#compare-pytorch');
  await page.waitForSelector('#pytorch', { state: 'detached' });

  step('the memory-efficient attention removes the T × T activations of a block');
  const activations = async () => page.$eval('g.layer[data-layer="layers.1"]',
    (g) => Number(g.dataset.activations));
  const eagerActivations = await activations();
  await page.check('#efficient-attention');
  await page.waitForFunction((b) => Number(document.querySelector(
    'g.layer[data-layer="layers.1"]').dataset.activations) !== b, eagerActivations);
  // SmolLM2-135M, T = 256, f32: three [H, T, T] tensors go (H = 9), the op's [T, H·Dh] output
  // comes; the per-row sums and log-sum-exps cancel; a few bytes of graph nodes differ.
  const removed = 3 * 4 * 9 * 256 * 256 - 4 * 256 * 576;
  report.efficient_attention_removed = eagerActivations - await activations();
  assert.ok(Math.abs(report.efficient_attention_removed - removed) < 0.01 * removed,
    `efficient attention removed ${report.efficient_attention_removed} vs ${removed}`);
  await page.uncheck('#efficient-attention');
  step('checkpointing draws the recomputed activations as outlines, with napkin estimate\'s numbers');
  // `napkin estimate --preset smollm2-135m --lora-r 16 --seq-len 256 --checkpointing --json`:
  // the page's default settings with checkpointing on.
  const estimate = JSON.parse(await readFile(process.env.NAPKIN_ESTIMATE_JSON, 'utf8')).inventory;
  const layerNumbers = () => page.$$eval('g.layer', (gs) => gs.map((g) =>
    [g.dataset.layer, Number(g.dataset.activations), Number(g.dataset.recomputed)]));
  assert.equal(await page.$$eval('#layer-chart rect.k-recomputed', (r) => r.length), 0,
    'no recomputed outline without checkpointing');
  const plainLayers = await layerNumbers();
  await page.check('#ckpt');
  await page.waitForSelector('#layer-chart rect.k-recomputed');
  const ckptLayers = await layerNumbers();
  assert.deepEqual(ckptLayers, estimate.per_layer.map((l) => [l.layer, l.activations, l.recomputed]),
    'the chart\'s kept and recomputed bytes are the JSON\'s');
  const recomputing = estimate.per_layer.filter((l) => l.recomputed > 0).length;
  assert.equal(recomputing, 30, 'every SmolLM2 block recomputes');
  assert.equal(await page.$$eval('#layer-chart rect.k-recomputed', (r) => r.length), recomputing);
  // The plain chart's kept activations of a block are the checkpointed one's recompute: the
  // inventory is the same, only how long the tensors live differs.
  assert.equal(plainLayers[1][1], ckptLayers[1][2]);
  assert.equal(plainLayers[1][2], 0);
  const outlineFill = await page.$eval('#layer-chart rect.k-recomputed',
    (r) => getComputedStyle(r).fill);
  assert.equal(outlineFill, 'none', 'the recomputed bytes are an outline, not a kept segment');
  const recomputedBlock = estimate.activations.recomputed_block;
  assert.match(await page.textContent('#seed-vs-inventory'),
    new RegExp(`recomputed, one block \\(layers\\.${recomputedBlock.layer}\\)`));
  report.checkpointing_recomputed_block = recomputedBlock;
  await page.uncheck('#ckpt');
  await page.waitForSelector('#layer-chart rect.k-recomputed', { state: 'detached' });
  const recipes = await page.$$eval('#precision-table tbody tr', (rows) => rows.length);
  assert.equal(recipes, 9, 'one precision-table row per recipe');

  step('DPO replays its reference forward; ORPO none; the PyTorch profile replays TRL\'s DPOTrainer, not ORPO');
  const timelineLabels = () => page.$$eval('#timeline-table tbody tr th', (ths) => ths.map((th) => th.textContent));
  assert.ok(!(await timelineLabels()).some((l) => l.startsWith('reference.')), 'no reference for SFT');
  await page.selectOption('#objective', 'dpo');
  await page.waitForFunction(() => [...document.querySelectorAll('#timeline-table tbody tr th')]
    .some((th) => th.textContent === 'reference.logits'));
  // SmolLM2-135M has 30 blocks: one reference event each, then its logits.
  assert.equal((await timelineLabels()).filter((l) => l.startsWith('reference.')).length, 31);
  await page.check('#compare-pytorch');
  await page.waitForSelector('#pytorch');
  assert.match(await page.textContent('#pytorch'), /TRL's DPOTrainer/);
  await page.selectOption('#objective', 'orpo');
  await page.waitForFunction(() => ![...document.querySelectorAll('#timeline-table tbody tr th')]
    .some((th) => th.textContent.startsWith('reference.')));
  assert.equal(await page.$('#pytorch'), null, 'no PyTorch profile for an ORPO step');
  await page.uncheck('#compare-pytorch');
  await page.selectOption('#objective', 'sft');

  step('DoRA adds 8 bytes an output row of each adapted linear (magnitude and kept squares)');
  const adapters = () => page.$eval('g.layer[data-layer="layers.0"]', (g) => Number(g.dataset.adapters));
  const loraAdapters = await adapters();
  await page.check('#dora');
  await page.waitForFunction((b) => Number(document.querySelector(
    'g.layer[data-layer="layers.0"]').dataset.adapters) !== b, loraAdapters);
  // SmolLM2-135M's block: q 576, k and v 192 each, o 576, gate and up 1536, down 576 rows.
  assert.equal(await adapters() - loraAdapters, 8 * (576 + 2 * 192 + 576 + 2 * 1536 + 576));
  await page.uncheck('#dora');

  step('a refused number is named under the controls, not ignored');
  await page.fill('#seq', '1');
  await page.dispatchEvent('#seq', 'change');
  await page.waitForSelector('#controls-error');
  assert.match(await page.textContent('#controls-error'), /^sequence length T: `1` is not a whole number from 2/);

  step('a training run in the page: QLoRA + checkpointing on tiny-smol, T = 64');
  await page.selectOption('#preset', 'tiny-smol');
  await page.fill('#seq', '64');
  await page.press('#seq', 'Enter');
  await page.dispatchEvent('#seq', 'change');
  await page.waitForSelector('#controls-error', { state: 'detached' });
  await page.check('#dq');
  await page.check('#ckpt');
  const trainStart = Date.now();
  await page.click('#train-button');
  await page.waitForSelector('#train-status[data-status="finished"], #train-status[data-status="failed"]',
    { timeout: 300_000 });
  report.train_wall_s = (Date.now() - trainStart) / 1000;
  const status = await page.textContent('#train-status');
  assert.doesNotMatch(status, /failed/, status);
  assert.match(await page.textContent('#backend'), /WebAssembly/);
  const losses = (await page.getAttribute('#losses', 'data-losses')).split(',').map(Number);
  report.losses = losses;
  assert.equal(losses.length, 20);
  assert.ok(losses.at(-1) < 0.8 * losses[0], `losses ${losses}`);
  report.tokens_per_second = Number(await page.getAttribute('#tokens-per-second', 'data-value'));
  assert.ok(report.tokens_per_second > 0);
  // The loss chart's numbers are in a table beside it, one row a step (four significant digits).
  const lossRows = await page.$$eval('#loss-chart .curve-table tbody tr', (trs) => trs.map((tr) =>
    [Number(tr.querySelector('th').textContent), Number(tr.querySelector('td').textContent)]));
  assert.equal(lossRows.length, losses.length, 'one loss-table row per step');
  lossRows.forEach(([stepNumber, loss], i) => {
    assert.equal(stepNumber, i + 1);
    assert.ok(Math.abs(loss - losses[i]) <= 1e-3 * losses[i], `table loss ${loss} vs ${losses[i]}`);
  });
  const rows = await page.$$eval('#train ~ * .measured-row, .panel .measured-row', (trs) =>
    trs.map((tr) => [tr.dataset.name, Number(tr.querySelector('.ratio').textContent)]));
  const blocks = rows.filter(([name]) => name.startsWith('layers.'));
  report.measured_blocks = Object.fromEntries(blocks);
  assert.equal(blocks.length, 4, `measured rows ${JSON.stringify(rows)}`);
  for (const [name, ratio] of blocks) {
    assert.ok(ratio > 0.9 && ratio < 1.1, `${name}: measured/predicted ${ratio}`);
  }
  assert.equal(await page.$$eval('rect.k-measured', (r) => r.length) >= 4, true);
  await page.screenshot({ path: join(artifacts, 'sandbox.png'), fullPage: true });

  if (withWebGpu) {
    step('the same run on WebGPU (second module, loaded now) gives the CPU run\'s losses');
    await page.selectOption('#train-backend', 'web_gpu');
    const gpuStart = Date.now();
    await page.click('#train-button');
    await page.waitForSelector('#train-status[data-status="running"]');
    await page.waitForSelector('#train-status[data-status="finished"], #train-status[data-status="failed"]',
      { timeout: 600_000 });
    report.webgpu_wall_s = (Date.now() - gpuStart) / 1000;
    const gpuStatus = await page.textContent('#train-status');
    assert.doesNotMatch(gpuStatus, /failed/, gpuStatus);
    report.webgpu_backend = await page.textContent('#backend');
    assert.match(report.webgpu_backend, /WebGPU/);
    const gpuLosses = (await page.getAttribute('#losses', 'data-losses')).split(',').map(Number);
    report.webgpu_losses = gpuLosses;
    assert.equal(gpuLosses.length, losses.length);
    gpuLosses.forEach((l, i) => assert.ok(Math.abs(l - losses[i]) < WEBGPU_LOSS_TOLERANCE * losses[i],
      `step ${i + 1}: WebGPU loss ${l} vs CPU ${losses[i]}`));
    report.webgpu_tokens_per_second = Number(await page.getAttribute('#tokens-per-second', 'data-value'));
    const resident = await page.$eval('#resident', (p) => ({
      predicted: Number(p.dataset.predicted), measured: Number(p.dataset.measured),
      host_side: Number(p.dataset.hostSide) }));
    report.webgpu_resident = resident;
    // The GPU's memory pool after the last step against the predictor's device bytes (NF4
    // codes and scales resident on the device, dequantized there by napkin's kernel).
    const residentRatio = resident.measured / resident.predicted;
    assert.ok(residentRatio > 0.9 && residentRatio < 1.1, `WebGPU resident ${JSON.stringify(resident)}`);
    assert.ok(resident.host_side > 0, 'a host copy of the NF4 codes and scales is reported');
    await page.screenshot({ path: join(artifacts, 'sandbox-webgpu.png'), fullPage: true });
  }

  step('files: a config.json becomes the model; a napkin measure report loads; junk is named');
  await page.setInputFiles('#config-file', process.env.NAPKIN_CONFIG_JSON);
  await page.waitForFunction(() => document.querySelector('#preset').value === 'config.json');
  await page.setInputFiles('#measurement-file', process.env.NAPKIN_MEASURE_JSON);
  await page.waitForSelector('#files .measured-row');
  step('a napkin train run\'s metrics.jsonl is drawn with axes');
  await page.setInputFiles('#metrics-file', process.env.NAPKIN_METRICS_JSONL);
  await page.waitForSelector('#imported-loss svg');
  const curves = await page.$$eval('#imported-loss polyline.c-series',
    (lines) => lines.map((l) => ({ class: l.getAttribute('class'), points: l.points.numberOfItems,
      width: l.getBoundingClientRect().width })));
  assert.deepEqual(curves.map((c) => c.class), ['c-series c-train', 'c-series c-eval']);
  assert.ok(curves.every((c) => c.points >= 2 && c.width > 100), JSON.stringify(curves));
  assert.ok(await page.$$eval('#imported-loss .c-tick', (t) => t.length) >= 4, 'axis ticks');
  assert.ok(await page.$$eval('#loss-chart .c-tick', (t) => t.length) >= 4, 'the page run\'s loss has axes too');
  report.imported_run = await page.textContent('#imported-run');
  await page.setInputFiles('#measurement-file',
    { name: 'junk.json', mimeType: 'application/json', buffer: Buffer.from('{"kinds": 1}') });
  await page.waitForSelector('#import-error');
  assert.match(await page.textContent('#import-error'), /^junk\.json: not the JSON of `napkin measure --json`/);

  step('the exercise mode checks an answer');
  await page.click('#open-exercises');
  await page.fill('#answer', '12 parsecs');
  await page.click('#check');
  await page.waitForSelector('#verdict');
  assert.equal(await page.getAttribute('#verdict', 'data-correct'), 'false');
  await page.click('#hint-button');
  await page.waitForSelector('#hint');

  step('nothing leaves the page');
  const blocked = await page.evaluate(async () => {
    const violations = [];
    document.addEventListener('securitypolicyviolation', (e) => violations.push(e.blockedURI));
    let fetched = true;
    try { await fetch('http://example.invalid/ping'); } catch { fetched = false; }
    await new Promise((r) => setTimeout(r, 100));
    return { fetched, violations };
  });
  assert.equal(blocked.fetched, false);
  assert.ok(blocked.violations.some((u) => u.includes('example.invalid')), JSON.stringify(blocked));
  const csp = await page.getAttribute('meta[http-equiv="Content-Security-Policy"]', 'content');
  assert.match(csp, /default-src 'self'/);
  const foreign = requests.filter((u) => !u.startsWith(origin) && !u.startsWith('data:'));
  assert.deepEqual(foreign.filter((u) => !u.includes('example.invalid')), [],
    'requests outside the page\'s origin');
  report.requests = requests.length;
  assert.deepEqual(consoleErrors.filter((e) => !e.includes('example.invalid') &&
    !e.includes('Content Security Policy')), [], 'console errors');

  await writeFile(join(artifacts, 'e2e-report.json'), JSON.stringify(report, null, 2));
  console.log(`e2e: passed ${JSON.stringify({
    first_render_ms: Math.round(report.first_render_ms),
    first_visit_bytes: report.first_visit_bytes,
    tokens_per_second: Math.round(report.tokens_per_second),
    train_wall_s: report.train_wall_s,
    nf4_block_ratio: report.nf4_block_ratio.toFixed(4),
    first_loss: losses[0].toFixed(3),
    last_loss: losses.at(-1).toFixed(3),
    webgpu_tokens_per_second: report.webgpu_tokens_per_second?.toFixed(0),
    webgpu_last_loss: report.webgpu_losses?.at(-1).toFixed(3),
    webgpu_resident: report.webgpu_resident,
  })}`);
} finally {
  await context.close();
  server.close();
  await rm(profile, { recursive: true, force: true });
}
