// The page's speed beside the native build's, in headless Chromium: for each built page
// (a web/dist folder; give two to compare builds, e.g. with and without a compiler flag) the
// f32 GEMMs at napkin-core's page shapes (`page_gemm_gflops`, burn Flex in this tab's one
// thread) and the tokens/s of the page's own training runs (tiny-smol, 20 steps: QLoRA + DQ +
// checkpointing at T = 64, as the e2e test trains, and full fine-tuning at T = 128); natively, `napkin bench matmul --page-shapes` (the same
// GEMM code on one thread). The builds and the native run alternate round by round; medians
// over rounds, with each page GEMM's ratio to the native median. Prints a table; writes
// artifacts/bench-page.json.
//
// Usage: node bench-page.mjs NAPKIN_BINARY LABEL=DIST [LABEL=DIST ...]
//   (env: CHROMIUM, ROUNDS (default 5), GEMM_RUNS (timed runs per GEMM, default 9))
import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { mkdtemp, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { serve } from '../serve.mjs';

const here = fileURLToPath(new URL('.', import.meta.url));
const [napkin, ...builds] = process.argv.slice(2);
if (!napkin || builds.length === 0 || builds.some((b) => !b.includes('='))) {
  console.error('usage: node bench-page.mjs NAPKIN_BINARY LABEL=DIST [LABEL=DIST ...]');
  process.exit(2);
}
/// The page's training runs: the controls each one sets.
const RUNS = [
  { name: 'QLoRA + DQ + ckpt, T = 64', seq: 64, lora: true, nf4: true, dq: true, ckpt: true },
  { name: 'full FT, T = 128', seq: 128, lora: false, nf4: false, dq: false, ckpt: false },
];
const rounds = Number(process.env.ROUNDS ?? 5);
const gemmRuns = Number(process.env.GEMM_RUNS ?? 9);
const pages = builds.map((b) => {
  const [label, dist] = b.split('=');
  return { label, dist: resolve(dist), gemm: [], tokensPerSecond: Object.fromEntries(RUNS.map((r) => [r.name, []])) };
});
const native = [];
const scratch = await mkdtemp(join(tmpdir(), 'napkin-bench-page-'));

/// One training run in a loaded page: its tokens/s.
async function train(page, run) {
  await page.selectOption('#preset', 'tiny-smol');
  await page.fill('#seq', String(run.seq));
  await page.dispatchEvent('#seq', 'change');
  await page.setChecked('#lora', run.lora);
  await page.setChecked('#nf4', run.nf4);
  if (run.nf4) await page.setChecked('#dq', run.dq);
  await page.setChecked('#ckpt', run.ckpt);
  await page.click('#train-button');
  await page.waitForSelector('#train-status[data-status="running"]');
  await page.waitForSelector(
    '#train-status[data-status="finished"], #train-status[data-status="failed"]',
    { timeout: 300_000 });
  const status = await page.textContent('#train-status');
  if (/failed/.test(status)) throw new Error(`the page's run (${run.name}) failed: ${status}`);
  return Number(await page.getAttribute('#tokens-per-second', 'data-value'));
}

/// The page module's glue in a build: content-hashed (napkin_web.<hash>.js) or, in a build
/// older than the hashed names, napkin_web.js.
function pageGlue(dist) {
  const glue = readdirSync(dist).find((f) => /^napkin_web(\.[0-9a-f]{12})?\.js$/.test(f));
  if (!glue) throw new Error(`${dist} holds no napkin_web glue: build it with scripts/ci/web-build.sh`);
  return glue;
}

/// One page build: its GEMM figures and each training run's tokens/s.
async function measurePage(context, origin, glue) {
  const page = await context.newPage();
  try {
    await page.goto(`${origin}/`);
    await page.waitForSelector('body[data-ready="true"]', { timeout: 60_000 });
    const gemm = JSON.parse(await page.evaluate(async ([runs, path]) => {
      const module = await import(path);
      return module.page_gemm_gflops(runs);
    }, [gemmRuns, `./${glue}`]));
    const tokensPerSecond = {};
    for (const run of RUNS) tokensPerSecond[run.name] = await train(page, run);
    return { gemm, tokensPerSecond };
  } finally {
    await page.close();
  }
}

function nativeFigures() {
  const out = join(scratch, 'native.json');
  execFileSync(napkin, ['bench', 'matmul', '--page-shapes', '--runs', String(gemmRuns),
    '--json', out], { stdio: ['ignore', 'ignore', 'inherit'] });
  return readFile(out, 'utf8').then(JSON.parse);
}

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
};
const key = (f) => `${f.product} ${f.m}x${f.k}x${f.n}`;

const profile = await mkdtemp(join(tmpdir(), 'napkin-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const servers = await Promise.all(pages.map((p) => serve(0, { root: p.dist })));
try {
  const chromiumVersion = context.browser()?.version() ?? 'Chromium';
  console.log(`${rounds} rounds, ${gemmRuns} timed runs per GEMM; ${chromiumVersion}; builds: ` +
    pages.map((p) => `${p.label} (${p.dist})`).join(', '));
  for (let round = 1; round <= rounds; round++) {
    native.push(await nativeFigures());
    for (const [i, p] of pages.entries()) {
      const origin = `http://127.0.0.1:${servers[i].address().port}`;
      const { gemm, tokensPerSecond } = await measurePage(context, origin, pageGlue(p.dist));
      p.gemm.push(gemm);
      for (const run of RUNS) p.tokensPerSecond[run.name].push(tokensPerSecond[run.name]);
    }
    console.log(`round ${round}: ` + pages.map((p) => `${p.label} ` +
      RUNS.map((r) => p.tokensPerSecond[r.name].at(-1).toFixed(0)).join(' / ') + ' tok/s').join(', '));
  }

  const shapes = native[0].map(key);
  const medianOf = (runs, k) => median(runs.map((figures) => figures.find((f) => key(f) === k).gflops));
  const table = shapes.map((k) => {
    const nativeGflops = medianOf(native, k);
    const row = { product: k, native_gflops: nativeGflops };
    for (const p of pages) {
      const gflops = medianOf(p.gemm, k);
      row[`${p.label}_gflops`] = gflops;
      row[`${p.label}_vs_native`] = gflops / nativeGflops;
    }
    return row;
  });
  console.log('\nf32 GEMM, GFLOP/s (medians over rounds; one thread each)');
  console.log('product'.padEnd(22) + 'native'.padStart(10) +
    pages.map((p) => `${p.label}`.padStart(14) + '× native'.padStart(10)).join(''));
  for (const row of table) {
    console.log(row.product.padEnd(22) + row.native_gflops.toFixed(2).padStart(10) +
      pages.map((p) => row[`${p.label}_gflops`].toFixed(2).padStart(14) +
        row[`${p.label}_vs_native`].toFixed(2).padStart(10)).join(''));
  }
  console.log('\nthe page\'s training runs (tiny-smol, 20 steps), tokens/s: median (range)');
  for (const run of RUNS) {
    console.log(run.name);
    for (const p of pages) {
      const sorted = [...p.tokensPerSecond[run.name]].sort((a, b) => a - b);
      console.log(`  ${p.label.padEnd(20)}${median(sorted).toFixed(0).padStart(10)}` +
        `   (${sorted[0].toFixed(0)}–${sorted.at(-1).toFixed(0)})`);
    }
  }
  await mkdir(join(here, 'artifacts'), { recursive: true });
  await writeFile(join(here, 'artifacts', 'bench-page.json'), JSON.stringify({
    rounds, gemm_runs: gemmRuns, gemm: table,
    tokens_per_second: Object.fromEntries(pages.map((p) => [p.label, p.tokensPerSecond])),
  }, null, 2));
} finally {
  await context.close();
  for (const s of servers) s.close();
  await rm(profile, { recursive: true, force: true });
  await rm(scratch, { recursive: true, force: true });
}
