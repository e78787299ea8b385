// The Crawlee side of the render benchmark (bench/render.py): render a list of URLs with
// Crawlee's PlaywrightCrawler and check a marker in each rendered page.
//
//   node bench/crawlee/crawl.mjs --pages pages.json --concurrency 4 --selector '#content' \
//       --browser /usr/lib/chromium/chromium-headless-shell --stats stats.json \
//       [--timeout 300] [--sync-out FD --sync-in FD]
//
// --pages is a JSON object {url: marker}. Every URL is requested once (no link is
// followed, as the other peers: the same list, each page once) with Crawlee's defaults
// but for what the comparison fixes: the browser (Debian's chromium-headless-shell, at
// --browser, headless), minConcurrency = maxConcurrency = --concurrency, a 30 s
// navigation timeout (scrapy-playwright's), and a page handler that waits for
// --selector, then counts the page correct when its marker is in page.content() (the
// rendered DOM). Storage is in memory only (persistStorage off, and CRAWLEE_STORAGE_DIR
// under a temporary directory removed at exit), so no state is left behind.
//
// The window measured is crawler.run(): the browser launch is inside, as for the other
// peers. With --sync-out/--sync-in (pipe fds from the bench, bench.proctree.WindowPipe)
// "open" is written before it and "close" after, each waiting for the bench's "go" (its
// CPU snapshots of this process tree). The result (pages, correct, failed, wall) is
// written to --stats and printed as one JSON line on stdout.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    pages: { type: 'string' },
    concurrency: { type: 'string' },
    selector: { type: 'string' },
    browser: { type: 'string' },
    stats: { type: 'string' },
    timeout: { type: 'string', default: '600' },
    'sync-out': { type: 'string' },
    'sync-in': { type: 'string' },
  },
});
for (const name of ['pages', 'concurrency', 'selector', 'browser']) {
  if (!args[name]) {
    console.error(`--${name} is required`);
    process.exit(2);
  }
}
const concurrency = Number.parseInt(args.concurrency, 10);
const timeoutSecs = Number.parseFloat(args.timeout);
if (!(concurrency >= 1) || !(timeoutSecs > 0)) {
  console.error('--concurrency must be >= 1 and --timeout > 0');
  process.exit(2);
}
const pages = JSON.parse(fs.readFileSync(args.pages, 'utf8'));

// Storage: memory only; anything Crawlee would still write goes under a directory of ours.
const storageDir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-crawlee-'));
process.env.CRAWLEE_STORAGE_DIR = storageDir;
process.env.CRAWLEE_PERSIST_STORAGE = 'false';
process.env.CRAWLEE_PURGE_ON_START = 'false';

// Crawlee reads its environment when it loads: import it only now.
const { Configuration, PlaywrightCrawler, log } = await import('crawlee');
const { chromium } = await import('playwright');

function sync(word) {
  // tell the bench `word` and wait for its "go" (bounded: 120 s)
  if (args['sync-out'] === undefined) return;
  const out = Number.parseInt(args['sync-out'], 10);
  const inp = Number.parseInt(args['sync-in'], 10);
  fs.writeSync(out, `${word}\n`);
  const buf = Buffer.alloc(64);
  const deadline = Date.now() + 120_000;
  let got = '';
  while (!got.includes('\n')) {
    if (Date.now() > deadline) throw new Error(`no go from the bench after ${word}`);
    let n;
    try {
      n = fs.readSync(inp, buf, 0, buf.length, null);
    } catch (err) {
      if (err.code === 'EAGAIN') {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
        continue;
      }
      throw err;
    }
    if (n === 0) throw new Error('the bench closed the window pipe');
    got += buf.toString('ascii', 0, n);
  }
}

let seen = 0;
let correct = 0;
let failed = 0;
const failures = [];
log.setLevel(log.LEVELS.INFO);
const config = new Configuration({ persistStorage: false, purgeOnStart: false });
const crawler = new PlaywrightCrawler(
  {
    launchContext: {
      launcher: chromium,
      launchOptions: { executablePath: args.browser, headless: true },
    },
    minConcurrency: concurrency,
    maxConcurrency: concurrency,
    navigationTimeoutSecs: 30,
    requestHandlerTimeoutSecs: 60,
    async requestHandler({ page, request }) {
      await page.waitForSelector(args.selector, { timeout: 30_000 });
      const html = await page.content();
      const marker = pages[request.url] ?? '';
      seen += 1;
      if (marker && html.includes(marker)) correct += 1;
    },
    failedRequestHandler({ request }, error) {
      failed += 1;
      if (failures.length < 5) failures.push(`${request.url} ${error?.message ?? ''}`.slice(0, 300));
    },
  },
  config,
);

let result;
let guard;
try {
  sync('open');
  const t0 = performance.now();
  guard = setTimeout(() => {
    log.error(`crawl not done after ${timeoutSecs} s: stopping`);
    crawler.autoscaledPool?.abort();
  }, timeoutSecs * 1000);
  const stats = await crawler.run(Object.keys(pages));
  const wall = (performance.now() - t0) / 1000;
  clearTimeout(guard);
  sync('close');
  result = {
    pages: seen,
    correct,
    failed,
    failures,
    crawl_wall_s: wall,
    crawlee_stats: {
      requestsFinished: stats.requestsFinished,
      requestsFailed: stats.requestsFailed,
      retryHistogram: stats.retryHistogram,
      requestAvgFinishedDurationMillis: stats.requestAvgFinishedDurationMillis,
    },
  };
} finally {
  clearTimeout(guard);
  fs.rmSync(storageDir, { recursive: true, force: true });
}
const text = JSON.stringify(result);
if (args.stats) fs.writeFileSync(args.stats, text);
console.log(text);
