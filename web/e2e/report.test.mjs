// `napkin report`'s page in real headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core): opened from disk, it makes no request but its own file, runs no script,
// draws every chart's lines with a real size (the loss curve falling, the held-out curve
// beside it), shows the sample generations and the memory check, and is saved as
// artifacts/report.png.
//
// Usage: node report.test.mjs REPORT_HTML   (env: CHROMIUM)
import assert from 'node:assert/strict';
import { mkdtemp, mkdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

const here = fileURLToPath(new URL('.', import.meta.url));
const artifacts = join(here, 'artifacts');
await mkdir(artifacts, { recursive: true });
const file = pathToFileURL(resolve(process.argv[2])).href;

const profile = await mkdtemp(join(tmpdir(), 'napkin-report-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  javaScriptEnabled: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const requests = [];
  context.on('request', (r) => requests.push(r.url()));
  const page = context.pages()[0] ?? await context.newPage();
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.goto(file);
  assert.deepEqual(requests, [file], 'the page loads nothing but itself');
  assert.equal(await page.$$eval('script', (s) => s.length), 0, 'no script');

  const charts = await page.$$eval('figure', (figures) => figures.map((f) => ({
    title: f.querySelector('figcaption').textContent,
    lines: [...f.querySelectorAll('polyline.c-series')].map((l) => {
      const box = l.getBoundingClientRect();
      return { class: l.getAttribute('class'), points: l.points.numberOfItems,
        width: box.width, first: l.points.numberOfItems ? l.points.getItem(0).y : null,
        last: l.points.numberOfItems ? l.points.getItem(l.points.numberOfItems - 1).y : null };
    }),
  })));
  assert.deepEqual(charts.map((c) => c.title),
    ['Loss', 'Learning rate', 'Gradient norm (before clipping)', 'Throughput', 'Heap memory']);
  for (const c of charts) {
    for (const l of c.lines) assert.ok(l.width > 100, `${c.title}: ${l.class} drawn (${l.width} px)`);
  }
  const [train, held] = charts[0].lines;
  assert.equal(held.class, 'c-series c-eval');
  assert.ok(train.last > train.first, 'the training loss falls (lower on screen: larger y)');
  assert.ok(held.points >= 2, 'the held-out loss: the baseline and the evaluations');
  assert.ok(await page.isVisible('text=Sample generations'));
  assert.ok(await page.isVisible('text=measured / predicted'));
  await page.screenshot({ path: join(artifacts, 'report.png'), fullPage: true });
  console.log(`report e2e: ${charts.length} charts, ${train.points} steps, ${held.points} evaluations; artifacts/report.png`);
} finally {
  await context.close();
  await rm(profile, { recursive: true, force: true });
}
