// The dashboard in a real browser (Debian's chromium, driven by playwright-core from npm)
// against a real coordinator with running workers: the page shows the run, its progress
// advances, the loss curve gains points as epochs close, each worker's rate matches what the
// server counted over the same time, the epoch axis has whole ticks, the loss axis turns
// logarithmic, each reported metric has its chart with the server's values, so has samples/s
// per epoch (each closed epoch's samples over its duration_s), the best epoch is
// marked, 1,002 workers make a table of 20 and a summary row, and a checkpoint cut and its
// restore by a new group show in the cuts panel and stand out in the events. Saves a screenshot.
// A run of 3,000 epochs: the page charts them all, and the loss of every completion over the
// whole run as the server's series hold it, and each poll after the first fetches only what
// changed (a status without its epochs, the epochs from the oldest open one, the newer
// completions, the series' newer points), a few kB however long the run. A step-mode run (cost-balanced, its mode left to
// the default): the steps panel shows the server's steps done of planned per set, the fitted
// cost model, each rank's batches and fitted speed, and the title says the run hands out steps.
// Comparing runs (/?run=A&compare=B): the compared runs on every chart point for point as the
// server holds them (samples/s per epoch too), polled for what changed only, picked and
// dropped with the checkboxes.
//   TRAINCOORD_BIN=build/traincoord EXAMPLE_WORKER_BIN=build/example_worker \
//   ARTIFACT_DIR=build/artifacts node --test tests/e2e/dashboard.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRequire } from "node:module";

const require = createRequire(new URL("../../web/package.json", import.meta.url));
const { chromium } = require("playwright-core");

const RUN = `
name = "dash"
[data]
train_batches = 40
dev_batches = 8
[schedule]
epochs = 8
[early_stop]
rule = "patience"
patience = 3
`;

function startServer(config) {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.env.TRAINCOORD_BIN, ["serve", "--config", config, "--in-memory",
      "--listen", "127.0.0.1:0"], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    const timer = setTimeout(() => reject(new Error(`server did not start: ${out}`)), 20000);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc, url: m[1] }); }
    });
  });
}

async function until(what, fn, ms = 30000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const v = await fn();
    if (v) return v;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out waiting for ${what}`);
}

test("the dashboard shows the run live: progress advances and the loss curve grows", async () => {
  const dir = mkdtempSync(join(tmpdir(), "traincoord-dash-"));
  const children = [];
  let browser;
  try {
    const config = join(dir, "dash.toml");
    writeFileSync(config, RUN);
    const server = await startServer(config);
    children.push(server.proc);
    for (const name of ["w1", "w2"]) {
      children.push(spawn(process.env.EXAMPLE_WORKER_BIN, ["--url", server.url, "--run", "dash",
        "--name", name, "--job-ms", "100"], { stdio: "ignore" }));
    }
    const api = async (path, body) => {
      const r = await fetch(server.url + path, body === undefined ? {} :
        { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });
      assert.ok(r.ok, `${path}: HTTP ${r.status}`);
      return r.json();
    };
    const jobsDone = async () => (await api("/v1/runs/dash")).progress.jobs_done;
    // The page opens on a run already under way: a rate "since the page was opened" would count
    // these jobs too.
    await until("the run to get going", async () => (await jobsDone()) >= 40);

    browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-gpu"] });
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    const opened = { t: Date.now(), done: await jobsDone() };
    await page.goto(server.url + "/");
    await page.waitForFunction(() => document.getElementById("title").textContent.includes("dash"));
    assert.match(await page.textContent("#title"), /run dash/);

    const done = async () => Number(await page.getAttribute("#progress-label", "data-done"));
    const first = await until("jobs to be done", async () => (await done()) > 0 && done());
    await until("progress to advance", async () => (await done()) > first);

    // Per-worker rates over the recent window, against the server's count over the same time.
    // (One read of the table: it is redrawn every second.)
    const rates = async () => page.evaluate(() => Object.fromEntries(
      [...document.querySelectorAll("tr.worker, tr.summary")].map((r) =>
        [r.dataset.name || "summary", r.dataset.rate === "" ? null : Number(r.dataset.rate)])));
    await new Promise((r) => setTimeout(r, 6000));
    const seen = await until("both workers' rates", async () => {
      const r = await rates();
      return r.w1 > 0 && r.w2 > 0 && r;
    });
    const measured = ((await jobsDone()) - opened.done) / ((Date.now() - opened.t) / 1000);
    const summary = seen.summary;
    assert.ok(seen.w1 < 1000 / 100 * 1.1 && seen.w2 < 1000 / 100 * 1.1,
      `a worker taking 100 ms a job does at most 10 jobs/s: ${JSON.stringify(seen)}`);
    assert.ok(Math.abs(seen.w1 + seen.w2 - summary) < 1e-9, `the summary row sums the rates: ${summary}`);
    assert.ok(Math.abs(summary - measured) / measured < 0.35,
      `the workers' rates (${summary.toFixed(2)} jobs/s) match the server's count (${measured.toFixed(2)} jobs/s)`);

    const points = async () => Number(await page.getAttribute("#epoch-chart", "data-points") || 0);
    const before = await points();
    await until("the loss curve to gain a point", async () => (await points()) > before);
    assert.ok(await page.locator("#epoch-chart canvas").count() > 0, "a chart is drawn");
    assert.ok((await page.textContent("#workers")).includes("w1"));
    // Three train and three dev epochs closed: whole epoch ticks only.
    await until("three epochs of each set", async () => (await points()) >= 6, 60000);
    const xticks = (await page.getAttribute("#epoch-chart", "data-xticks")).split(",").map(Number);
    assert.ok(xticks.length >= 2 && xticks.every(Number.isInteger), `epoch ticks: ${xticks}`);

    // The best epoch, as the server's early stopping has it, is marked.
    const es = (await api("/v1/runs/dash")).early_stop;
    assert.notEqual(es.best_epoch, null);
    await until("the best epoch marked", async () =>
      Number(await page.getAttribute("#epoch-chart", "data-best-epoch")) >= es.best_epoch);
    const status = await api("/v1/runs/dash");
    const marked = Number(await page.getAttribute("#epoch-chart", "data-best-epoch"));
    assert.ok(marked === status.early_stop.best_epoch || marked === es.best_epoch, `marked ${marked}`);
    assert.match(await page.textContent("#best-note"), new RegExp(`^best epoch ${marked}: `));

    // A chart per metric: the example worker reports accuracy = 1 - loss / 2 with every job.
    const charted = await page.evaluate(() => {
      const c = state.metricCharts.get("accuracy");
      return c ? { epochs: c.data[0], train: c.data[1], dev: c.data[2] } : null;
    });
    const history = await api("/v1/runs/dash/history");  // (after: a closed epoch stays closed)
    assert.ok(charted, "an accuracy chart");
    assert.equal(await page.locator("#metric-charts section[data-metric=accuracy] canvas").count(), 1);
    let compared = 0;
    for (const set of ["train", "dev"]) {
      charted[set].forEach((v, i) => {
        if (v === null) return;
        const e = history.epochs.find((x) => x.set === set && x.epoch === charted.epochs[i]);
        assert.ok(e && e.closed, `${set} ${charted.epochs[i]} is closed`);
        assert.ok(Math.abs(v - e.metrics.accuracy) < 1e-12, `${set} ${e.epoch}: ${v} vs ${e.metrics.accuracy}`);
        assert.ok(Math.abs(v - (1 - e.loss / 2)) < 1e-9, `accuracy is 1 - loss / 2: ${v}, ${e.loss}`);
        compared++;
      });
    }
    assert.ok(compared >= 6, `compared ${compared} values`);

    // Samples/s per epoch: each closed epoch's samples over its duration_s, as the history has
    // them (the example worker reports 32 samples a batch).
    const throughput = await page.evaluate(() => {
      const c = state.throughputChart;
      return c ? { epochs: c.data[0], train: c.data[1], dev: c.data[2] } : null;
    });
    assert.ok(throughput, "a samples/s chart");
    assert.equal(await page.locator("#throughput-chart canvas").count(), 1);
    let rated = 0;
    for (const set of ["train", "dev"]) {
      throughput[set].forEach((v, i) => {
        if (v === null) return;
        const e = history.epochs.find((x) => x.set === set && x.epoch === throughput.epochs[i]);
        assert.ok(e && e.closed && e.samples > 0 && e.duration_s > 0, `${set} ${throughput.epochs[i]}: ${JSON.stringify(e)}`);
        assert.equal(v, e.samples / e.duration_s, `${set} ${e.epoch} samples/s`);
        rated++;
      });
    }
    assert.ok(rated >= 6, `compared ${rated} samples/s values`);

    // The log-scale toggle: a logarithmic loss axis with ticks at 1, 2, 5 times powers of ten.
    await page.check("#loss-log");
    await until("a log axis", async () => (await page.getAttribute("#epoch-chart", "data-scale")) === "log");
    assert.equal(await page.evaluate(() => state.epochChart.scales.y.distr), 3);
    // (uPlot draws the new axis on the next frame.)
    const yticks = await until("the log axis drawn", async () => {
      const t = (await page.getAttribute("#epoch-chart", "data-yticks")).split(",").map(Number);
      return t.every((v) => v > 0) && t;
    });
    assert.ok(yticks.length >= 2, `log ticks: ${yticks}`);
    for (const v of yticks) {
      const mantissa = v / 10 ** Math.floor(Math.log10(v) + 1e-9);
      assert.ok([1, 2, 5].some((m) => Math.abs(mantissa - m) < 1e-6), `log tick ${v}`);
    }

    // 1,002 workers: the 20 busiest (the two that work come first) and a summary of all.
    for (let i = 0; i < 1000; i += 50) {
      await Promise.all(Array.from({ length: 50 }, (_, k) =>
        api("/v1/runs/dash/workers", { name: `idle-${String(i + k).padStart(4, "0")}` })));
    }
    await until("the summary of 1,002 workers", async () =>
      (await page.getAttribute("tr.summary", "data-workers")) === "1002");
    assert.equal(await page.locator("#workers tr").count(), 1 + 20 + 1, "header, 20 workers, summary");
    const names = await page.$$eval("tr.worker", (rows) => rows.map((r) => r.dataset.name));
    assert.deepEqual(names.slice(0, 2).sort(), ["w1", "w2"], `the busiest first: ${names}`);
    assert.match(await page.textContent("tr.summary"), /all 1002 \(\d+ active\); 982 more not shown/);

    // Checkpoint cuts: before any, the panel says so.
    assert.equal(await page.getAttribute("#cuts", "data-latest"), "");
    assert.match(await page.textContent("#cuts-latest"), /none yet/);
    assert.match(await page.textContent("#cuts-group"), /^none \(generation 0\)/);
    // A group of one rank takes a cut while the workers train on, then stops; a restarted group
    // restores the cut (the jobs completed after it are withdrawn).
    const rank = await api("/v1/runs/dash/workers", { name: "rank-0", group: "dash-1" });
    assert.equal(rank.group_state, "current");
    const share = await api("/v1/runs/dash/cuts",
      { worker: rank.worker, group: "dash-1", seq: 1, rank: 0, world_size: 1, parts: [] });
    assert.equal(share.complete, true);
    const atCut = await jobsDone();
    await until("jobs done after the cut", async () => {
      const s = await api("/v1/runs/dash");
      return s.state !== "running" || s.progress.jobs_done >= atCut + 3;
    });
    for (const c of children.slice(1)) c.kill("SIGKILL");  // the workers: no more events
    const again = await api("/v1/runs/dash/workers", { name: "rank-0b", group: "dash-2" });
    assert.equal(again.group_state, "restore_required");
    assert.equal(again.latest_cut, share.cut);
    const restored = await api("/v1/runs/dash/restore", { group: "dash-2", cut: share.cut });
    assert.equal(restored.restored, true);
    await until("the restore shown", async () =>
      (await page.getAttribute("#cuts", "data-restores")) === "1");
    const after = await api("/v1/runs/dash");
    const panel = await page.evaluate(() => ({ ...document.getElementById("cuts").dataset }));
    assert.deepEqual(panel, {
      generation: String(after.generation), group: "dash-2", count: String(after.cuts.count),
      latest: String(share.cut), restores: "1", withdrawn: String(after.counters.jobs_withdrawn),
    });
    assert.equal(after.generation, 2);
    assert.equal(after.counters.jobs_withdrawn, restored.withdrawn_jobs);
    assert.match(await page.textContent("#cuts-group"), /^dash-2 \(generation 2\)/);
    const latestText = await page.textContent("#cuts-latest");
    assert.match(latestText, new RegExp(`^cut ${share.cut} at ${after.cuts.latest.set} epoch ` +
      `${after.cuts.latest.epoch}: ${after.cuts.latest.jobs_done} jobs done, 0 partly trained`));
    assert.match(await page.textContent("#cuts-withdrawn"), new RegExp(`^${restored.withdrawn_jobs} `));
    // The events of cuts are marked apart from the others, each kind in its own colour.
    const checkpointRows = await page.$$eval("#events tr.checkpoint", (rows) => rows.map((r) =>
      ({ kind: r.dataset.kind, color: getComputedStyle(r.querySelector(".kind")).color })));
    const kinds = new Set(checkpointRows.map((m) => m.kind));
    for (const k of ["cut_taken", "restored", "group_started"]) assert.ok(kinds.has(k), `${k} marked: ${JSON.stringify(checkpointRows)}`);
    const colors = new Map(checkpointRows.map((m) => [m.kind, m.color]));
    assert.equal(new Set(colors.values()).size, 3, `a colour per kind: ${JSON.stringify([...colors])}`);
    assert.equal(await page.locator("#events tr.checkpoint[data-kind=worker_joined]").count(), 0);

    const artifacts = process.env.ARTIFACT_DIR || dir;
    mkdirSync(artifacts, { recursive: true });
    await page.screenshot({ path: join(artifacts, "dashboard.png"), fullPage: true });
  } finally {
    if (browser) await browser.close();
    for (const c of children) c.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
});

const LONG_RUN = `
name = "long"
[data]
train_batches = 1
dev_batches = 0
[schedule]
epochs = 100000
`;

test("a run of 3,000 epochs: the page charts them all, and a poll fetches only what changed", async () => {
  const dir = mkdtempSync(join(tmpdir(), "traincoord-dash-"));
  let serverProc;
  let browser;
  try {
    const config = join(dir, "long.toml");
    writeFileSync(config, LONG_RUN);
    const server = await startServer(config);
    serverProc = server.proc;
    const api = async (path, body) => {
      const r = await fetch(server.url + path, body === undefined ? {} :
        { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });
      assert.ok(r.ok, `${path}: HTTP ${r.status}`);
      return r.json();
    };
    // One job an epoch, trained through the API: epoch i closes with loss 1 / (i + 1).
    const worker = (await api("/v1/runs/long/workers", { name: "w" })).worker;
    let lease = (await api("/v1/runs/long/acquire", { worker })).job.lease;
    let trained = 0;
    const train = async (epochs) => {
      for (let i = 0; i < epochs; i++, trained++) {
        const r = await api("/v1/runs/long/complete", { worker, lease, loss: 1 / (trained + 1), next: true });
        assert.equal(r.outcome, "accepted");
        lease = r.next.job.lease;
      }
    };
    await train(3000);
    const full = await fetch(server.url + "/v1/runs/long/history");
    const fullBytes = (await full.arrayBuffer()).byteLength;

    browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-gpu"] });
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    const replies = [];  // every reply the page got from the run's endpoints, with its size
    page.on("response", async (r) => {
      if (!r.url().includes("/v1/runs/long")) return;
      const body = await r.body().catch(() => null);
      replies.push({ url: new URL(r.url()), bytes: body ? body.length : -1 });
    });
    await page.goto(server.url + "/?run=long");
    const points = async () => Number(await page.getAttribute("#epoch-chart", "data-points") || 0);
    await until("3,000 epochs charted", async () => (await points()) === 3000, 60000);
    // The chart holds every closed epoch's loss, the first as the last, and the open one (3000).
    const charted = await page.evaluate(() => ({ x: state.epochChart.data[0], y: state.epochChart.data[1] }));
    assert.equal(charted.x.length, 3001);
    assert.deepEqual([charted.x[0], charted.x[2999], charted.x[3000]], [0, 2999, 3000]);
    assert.ok(Math.abs(charted.y[0] - 1) < 1e-12 && Math.abs(charted.y[2999] - 1 / 3000) < 1e-12,
      `losses ${charted.y[0]}, ${charted.y[2999]}`);
    assert.equal(charted.y[3000], null);
    // The loss of every completion over the whole run: the server's series, point for point
    // (3,000 values at stride 4: 750 kept and the latest).
    const series = await (await fetch(server.url + "/v1/runs/long/series")).json();
    const loss = series.series.find((s) => s.set === "train" && s.name === "loss");
    const expected = loss.latest ? [...loss.points, loss.latest] : loss.points;
    assert.equal(loss.stride, 4);
    assert.equal(expected.length, 751);
    const lossChart = '.series-chart[data-name="loss"]';
    await until("the whole-run loss charted", async () =>
      Number(await page.getAttribute(lossChart, "data-points") || 0) === expected.length);
    const drawn = await page.evaluate(() => state.seriesCharts.get("loss").data);
    assert.deepEqual(drawn[0], expected.map((p) => p[0]));
    assert.deepEqual(drawn[1], expected.map((p) => p[2]));

    // Five more epochs while the page polls: it charts them, fetching only what changed.
    const mark = replies.length;
    for (let i = 0; i < 5; i++) {
      await train(1);
      await new Promise((r) => setTimeout(r, 300));
    }
    await until("3,005 epochs charted", async () => (await points()) === 3005);
    const polled = replies.length;
    await until("two more polls", async () => replies.length >= polled + 4);
    const later = replies.slice(mark);
    const statuses = later.filter((r) => r.url.pathname === "/v1/runs/long");
    const histories = later.filter((r) => r.url.pathname === "/v1/runs/long/history");
    const seriesPolls = later.filter((r) => r.url.pathname === "/v1/runs/long/series");
    assert.ok(seriesPolls.length >= 2, `series polls: ${later.map((r) => r.url)}`);
    for (const r of seriesPolls) {
      assert.ok(Number(r.url.searchParams.get("after")) >= 3000, `only the newer points: ${r.url}`);
      assert.ok(r.bytes > 0 && r.bytes < 2048, `a series poll of ${r.bytes} bytes: ${r.url}`);
    }
    await until("3,005 completions charted", async () => (await page.evaluate(() => {
      const xs = state.seriesCharts.get("loss").data[0];
      return xs[xs.length - 1];
    })) === 3005);
    assert.ok(statuses.length >= 2 && histories.length >= 2, `polls: ${later.map((r) => r.url.search)}`);
    for (const r of statuses) {
      assert.equal(r.url.searchParams.get("epochs"), "0", `a status without epochs: ${r.url}`);
      assert.ok(r.bytes > 0 && r.bytes < 16384, `a status of ${r.bytes} bytes`);
    }
    for (const r of histories) {
      assert.ok(Number(r.url.searchParams.get("from")) >= 2999, `the epochs from the open one: ${r.url}`);
      assert.ok(r.bytes > 0 && r.bytes < 16384, `a history of ${r.bytes} bytes: ${r.url}`);
    }
    const perPoll = Math.max(...later.map((r) => r.bytes));
    console.log(`long run: the whole history ${fullBytes} bytes; a poll after the first at most ` +
      `${perPoll} bytes a request`);
    assert.ok(fullBytes > 100000 && perPoll < fullBytes / 10);
  } finally {
    if (browser) await browser.close();
    if (serverProc) serverProc.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
});

// A cost-balanced run that leaves schedule.mode to its default: a group of two ranks asking
// first makes it a step-mode run. 96 train samples of lengths 1 … 12, a budget of 48 padded
// length units a batch, 2 epochs with a dev set of 16.
const STEP_RUN = `
name = "steps"
[data]
train_samples = 96
dev_samples = 16
train_lengths = "train.txt"
dev_lengths = "dev.txt"
seed = 3
[schedule]
epochs = 2
batch_budget = 48.0
`;

test("a step-mode run: the steps panel shows the server's steps, cost model and ranks", async () => {
  const dir = mkdtempSync(join(tmpdir(), "traincoord-dash-"));
  let serverProc;
  let browser;
  try {
    const length = (i) => 1 + ((i * 7) % 12);
    writeFileSync(join(dir, "train.txt"), Array.from({ length: 96 }, (_, i) => length(i)).join("\n") + "\n");
    writeFileSync(join(dir, "dev.txt"), Array.from({ length: 16 }, (_, i) => length(i)).join("\n") + "\n");
    const config = join(dir, "steps.toml");
    writeFileSync(config, STEP_RUN);
    const server = await startServer(config);
    serverProc = server.proc;
    const api = async (path, body) => {
      const r = await fetch(server.url + path, body === undefined ? {} :
        { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });
      const json = await r.json();
      assert.ok(r.ok, `${path}: HTTP ${r.status} ${JSON.stringify(json)}`);
      return json;
    };
    assert.equal((await api("/v1/runs/steps")).mode, "steps");  // (a batch budget is steps)
    // Two ranks of group g, in lockstep through the API: each reports its batch's time, rank 1
    // taking twice as long per padded unit (a slower GPU), so the model fits per rank.
    const ranks = [];
    for (const rank of [0, 1]) {
      ranks.push((await api("/v1/runs/steps/workers",
        { name: `r${rank}`, group: "g", rank, world_size: 2 })).worker);
    }
    const lengths = Array.from({ length: 96 }, (_, i) => length(i));
    let steps = 0;
    let trainSteps = 0;  // (the cost model and the ranks' pace count train batches)
    for (; steps < 14; steps++) {
      const jobs = [];
      for (const worker of ranks) jobs.push(await api("/v1/runs/steps/acquire", { worker, group: "g" }));
      if (jobs.some((j) => j.status !== "job")) break;
      if (jobs[0].job.set === "train") trainSteps++;
      for (let r = 0; r < 2; r++) {
        const { lease, samples, set } = jobs[r].job;
        const longest = Math.max(0, ...samples.map((s) => (set === "train" ? lengths[s] : length(s))));
        const seconds = (1 + r) * 0.001 * (0.5 + samples.length * longest);
        assert.equal((await api("/v1/runs/steps/complete",
          { worker: ranks[r], group: "g", lease, loss: 1, samples: samples.length, seconds })).outcome, "accepted");
      }
    }
    assert.ok(steps >= 10, `${steps} steps trained`);
    const status = await api("/v1/runs/steps");
    assert.equal(status.steps.world_size, 2);

    browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-gpu"] });
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    await page.goto(server.url + "/?run=steps");
    await page.waitForFunction(() => !document.getElementById("steps-section").hidden);
    assert.equal(await page.textContent("#title .mode"), "steps");  // how it hands out work
    assert.equal(await page.getAttribute("#steps", "data-world-size"), "2");
    // Each set's latest epoch laid out: its steps done of planned, as the server counts them.
    for (const s of status.steps.sets) {
      const row = page.locator(`#steps tr[data-set="${s.set}"] .steps-done`);
      assert.equal(await row.textContent(), `${s.done} / ${s.planned}`, `${s.set}`);
    }
    const train = status.steps.sets.find((s) => s.set === "train");
    assert.ok(train && train.done > 0, JSON.stringify(status.steps.sets));
    // The cost model as the server fitted it, and each rank's batches and fitted speed.
    assert.ok(status.cost_model && status.cost_model.reports === 2 * trainSteps, JSON.stringify(status.cost_model));
    const model = await page.textContent("#steps-model");
    assert.ok(model.includes(`from ${status.cost_model.reports} reports`), model);
    if (status.cost_model.fitted) assert.ok(model.includes(status.cost_model.model), model);
    for (const r of status.steps.ranks) {
      const cells = await page.locator(`#steps tr[data-rank="${r.rank}"] td`).allTextContents();
      assert.equal(cells[3], String(r.batches), `rank ${r.rank}: ${cells}`);
      assert.equal(cells[2], r.speed === null ? "–" : r.speed.toFixed(2), `rank ${r.rank}: ${cells}`);
    }
    // The ranks' batches add up to the steps trained.
    assert.equal(status.steps.ranks.reduce((a, r) => a + r.batches, 0), 2 * trainSteps);
    // Rank 1 took twice as long per padded unit: the fitted speeds say so.
    assert.ok(status.cost_model.fitted && Math.abs(status.cost_model.speeds[1] / status.cost_model.speeds[0] - 2) < 0.05,
      JSON.stringify(status.cost_model));
  } finally {
    if (browser) await browser.close();
    if (serverProc) serverProc.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
});

// Comparing runs: three runs on one coordinator trained through the API, of different lengths
// and losses; B reports a metric ("bleu") that A does not. The page opened on
// /?run=A&compare=B,nosuch draws B beside A on every chart (loss per epoch, samples/s per
// epoch, each metric per epoch, each series over the whole run), point for point as the server's replies hold them,
// and says that "nosuch" cannot be fetched; while B trains on, each poll asks only for B's newer
// points and open epochs; and the checkboxes beside the runs pick and drop runs, in the URL too.
const COMPARE_RUN = (name) => ({ name, data: { train_batches: 2, dev_batches: 1 }, schedule: { epochs: 100 } });

test("comparing runs: compared runs drawn on every chart, polled for what changed, picked in the list", async () => {
  const dir = mkdtempSync(join(tmpdir(), "traincoord-dash-"));
  let serverProc;
  let browser;
  try {
    const config = join(dir, "a.toml");
    writeFileSync(config, 'name = "A"\n[data]\ntrain_batches = 2\ndev_batches = 1\n[schedule]\nepochs = 100\n');
    const server = await startServer(config);
    serverProc = server.proc;
    const api = async (path, body) => {
      const r = await fetch(server.url + path, body === undefined ? {} :
        { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });
      assert.ok(r.ok, `${path}: HTTP ${r.status}`);
      return r.json();
    };
    for (const name of ["B", "C"]) await api("/v1/runs", COMPARE_RUN(name));
    // One worker a run, one job at a time: completion n of run A has loss 1 / n, of B 2 / n + 0.5
    // and a bleu of n / 100, of C 3 / n; each reports its accuracy, and 32 samples.
    const workers = {};
    const train = async (run, count) => {
      if (!workers[run]) {
        const worker = (await api(`/v1/runs/${run}/workers`, { name: "w" })).worker;
        workers[run] = { worker, n: 0, lease: (await api(`/v1/runs/${run}/acquire`, { worker })).job.lease };
      }
      const w = workers[run];
      for (let i = 0; i < count; i++) {
        const n = ++w.n;
        const loss = run === "A" ? 1 / n : run === "B" ? 2 / n + 0.5 : 3 / n;
        const metrics = { accuracy: 1 - loss / 4, ...(run === "B" ? { bleu: n / 100 } : {}) };
        const r = await api(`/v1/runs/${run}/complete`, { worker: w.worker, lease: w.lease, loss, samples: 32, metrics, next: true });
        assert.equal(r.outcome, "accepted");
        assert.equal(r.next.status, "job");
        w.lease = r.next.job.lease;
      }
    };
    await train("A", 18);  // 6 epochs of 2 train jobs and 1 dev job
    await train("B", 12);  // 4
    await train("C", 6);   // 2

    browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-gpu"] });
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    const replies = [];  // every reply from a run's endpoints, with its size
    page.on("response", async (r) => {
      if (!r.url().includes("/v1/runs/")) return;
      const body = await r.body().catch(() => null);
      replies.push({ url: new URL(r.url()), bytes: body ? body.length : -1 });
    });

    // What the charts should hold for `runs` (the chosen one first), from the server's replies:
    // the list of mismatches, empty when every chart holds them point for point.
    const mismatches = async (runs) => {
      const series = {}, history = {};
      for (const run of runs) {
        series[run] = (await api(`/v1/runs/${run}/series`)).series;
        history[run] = await api(`/v1/runs/${run}/history?jobs_after=1000000`);
      }
      const drawn = await page.evaluate(() => !state.epochChart ? null : ({
        series: Object.fromEntries([...state.seriesCharts].map(([n, c]) =>
          [n, { data: c.data, labels: c.series.slice(1).map((s) => s.label) }])),
        epochs: { data: state.epochChart.data, labels: state.epochChart.series.slice(1).map((s) => s.label) },
        metrics: Object.fromEntries([...state.metricCharts].map(([n, c]) => [n, { data: c.data }])),
        throughput: { data: state.throughputChart.data, labels: state.throughputChart.series.slice(1).map((s) => s.label) },
      }));
      if (!drawn) return ["nothing drawn yet"];
      const out = [];
      const labels = runs.length > 1 ? runs.flatMap((r) => [`${r} train`, `${r} dev`]) : ["train", "dev"];
      // A chart's column for run i and `set` against the expected [x, value] pairs.
      const check = (what, chart, i, set, expected) => {
        const [xs, ...columns] = chart.data;
        const column = columns[2 * i + (set === "train" ? 0 : 1)] || [];
        const got = xs.map((x, k) => [x, column[k]]).filter(([, v]) => v !== null && v !== undefined);
        if (JSON.stringify(got) !== JSON.stringify(expected)) {
          out.push(`${what} ${runs[i]} ${set}: ${JSON.stringify(got).slice(0, 200)} vs ${JSON.stringify(expected).slice(0, 200)}`);
        }
      };
      const names = [...new Set(runs.flatMap((r) => series[r].map((s) => s.name)))];
      for (const name of names) {
        const chart = drawn.series[name];
        if (!chart) { out.push(`no ${name} series chart`); continue; }
        if (JSON.stringify(chart.labels) !== JSON.stringify(labels)) out.push(`${name} labels ${chart.labels}`);
        runs.forEach((run, i) => {
          for (const set of ["train", "dev"]) {
            const s = series[run].find((x) => x.set === set && x.name === name);
            const points = !s ? [] : s.latest ? [...s.points, s.latest] : s.points;
            check(`series ${name}`, chart, i, set, points.map((p) => [p[0], p[2]]));
          }
        });
      }
      if (Object.keys(drawn.series).length !== names.length) out.push(`series charts ${Object.keys(drawn.series)}`);
      if (JSON.stringify(drawn.epochs.labels) !== JSON.stringify(labels)) out.push(`epoch labels ${drawn.epochs.labels}`);
      if (JSON.stringify(drawn.throughput.labels) !== JSON.stringify(labels)) out.push(`samples/s labels ${drawn.throughput.labels}`);
      const metricNames = [...new Set(runs.flatMap((r) => history[r].epochs.flatMap((e) => Object.keys(e.metrics))))];
      for (const name of metricNames) if (!drawn.metrics[name]) out.push(`no ${name} metric chart`);
      runs.forEach((run, i) => {
        for (const set of ["train", "dev"]) {
          const closed = history[run].epochs.filter((e) => e.set === set && e.closed);
          check("epoch loss", drawn.epochs, i, set, closed.map((e) => [e.epoch, e.loss]));
          check("epoch samples/s", drawn.throughput, i, set,
            closed.filter((e) => e.duration_s > 0).map((e) => [e.epoch, e.samples / e.duration_s]));
          for (const name of metricNames) {
            if (drawn.metrics[name]) {
              check(`epoch ${name}`, drawn.metrics[name], i, set,
                closed.filter((e) => name in e.metrics).map((e) => [e.epoch, e.metrics[name]]));
            }
          }
        }
      });
      return out;
    };
    const matches = async (runs) => {
      let last = [];
      try {
        await until(`the charts of ${runs}`, async () => (last = await mismatches(runs)).length === 0, 15000);
      } catch (e) {
        assert.fail(`${e.message}: ${last.join("; ")}`);
      }
    };

    await page.goto(server.url + "/?run=A&compare=B,nosuch");
    await matches(["A", "B"]);
    // Both runs' bleu: A has none, B its own; a run that cannot be fetched is said to be gone.
    assert.ok(await page.evaluate(() => state.seriesCharts.has("bleu") && state.metricCharts.has("bleu")));
    assert.match(await page.textContent('#compare label[data-run="nosuch"]'), /^nosuch \(gone\)$/);
    assert.equal(await page.isChecked('#compare input[value="B"]'), true);
    assert.equal(await page.isChecked('#compare input[value="C"]'), false);

    // B trains on while the page polls: each of its polls asks only for what changed.
    const mark = replies.length;
    for (let i = 0; i < 6; i++) {
      await train("B", 1);
      await new Promise((r) => setTimeout(r, 250));
    }
    await matches(["A", "B"]);
    const polled = replies.length;
    await until("two more polls", async () => replies.length >= polled + 8);
    const later = replies.slice(mark);
    const seriesPolls = later.filter((r) => r.url.pathname === "/v1/runs/B/series");
    const historyPolls = later.filter((r) => r.url.pathname === "/v1/runs/B/history");
    assert.ok(seriesPolls.length >= 3 && historyPolls.length >= 3, `B's polls: ${later.map((r) => r.url.pathname + r.url.search)}`);
    for (const r of seriesPolls) {
      assert.ok(Number(r.url.searchParams.get("after")) >= 12, `only B's newer points: ${r.url}`);
      assert.ok(r.bytes > 0 && r.bytes < 2048, `a series poll of ${r.bytes} bytes: ${r.url}`);
    }
    for (const r of historyPolls) {
      assert.ok(Number(r.url.searchParams.get("from")) >= 8, `B's epochs from the open one: ${r.url}`);
      assert.ok(Number(r.url.searchParams.get("jobs_after")) > 1e15, `no completions of B: ${r.url}`);
      assert.ok(r.bytes > 0 && r.bytes < 2048, `a history poll of ${r.bytes} bytes: ${r.url}`);
    }
    // (C is not compared: never asked.)
    assert.ok(!replies.some((r) => r.url.pathname.startsWith("/v1/runs/C")));
    console.log(`comparing: a compared run's poll at most ${Math.max(...[...seriesPolls, ...historyPolls].map((r) => r.bytes))} bytes a request`);

    // The checkboxes: drop "nosuch", pick C, drop B, drop C; the URL and the charts follow.
    const search = () => page.evaluate(() => location.search);
    // (A click in the page: Playwright's check/uncheck, which click by coordinates, once timed
    // out on a loaded machine with the box unchanged while the page redrew around it.)
    const toggle = async (run, checked) => {
      await page.waitForSelector(`#compare input[value="${run}"]`);
      await page.evaluate(([run, checked]) => {
        const box = document.querySelector(`#compare input[value="${run}"]`);
        if (box.checked !== checked) box.click();
      }, [run, checked]);
    };
    await toggle("nosuch", false);
    assert.equal(await search(), "?run=A&compare=B");
    await toggle("C", true);
    assert.equal(await search(), "?run=A&compare=B,C");
    await matches(["A", "B", "C"]);
    await toggle("B", false);
    assert.equal(await search(), "?run=A&compare=C");
    await matches(["A", "C"]);
    assert.equal(await page.evaluate(() => state.seriesCharts.has("bleu")), false, "bleu is B's alone");
    await toggle("C", false);
    assert.equal(await search(), "?run=A");
    await matches(["A"]);
    // The runs' links keep what is compared; a reload keeps it too.
    await toggle("B", true);
    await until("the runs' links to keep B", async () =>
      (await page.getAttribute('#runs a[href^="?run=C"]', "href")) === "?run=C&compare=B");
    await page.reload();
    await matches(["A", "B"]);
    const artifacts = process.env.ARTIFACT_DIR || dir;
    mkdirSync(artifacts, { recursive: true });
    await page.screenshot({ path: join(artifacts, "dashboard-compare.png"), fullPage: true });
  } finally {
    if (browser) await browser.close();
    if (serverProc) serverProc.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
});
