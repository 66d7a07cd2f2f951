// The dashboard in a real browser (Debian's chromium, driven by playwright-core from npm)
// against a real coordinator with running workers: the page shows the run, its progress
// advances, and the loss curve gains points as epochs close. Saves a screenshot.
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
epochs = 6
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
        "--name", name, "--job-ms", "60"], { stdio: "ignore" }));
    }
    browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-gpu"] });
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    await page.goto(server.url + "/");
    await page.waitForFunction(() => document.getElementById("title").textContent.includes("dash"));
    assert.match(await page.textContent("#title"), /run dash/);

    const done = async () => Number(await page.getAttribute("#progress-label", "data-done"));
    const first = await until("jobs to be done", async () => (await done()) > 0 && done());
    await until("progress to advance", async () => (await done()) > first);

    const points = async () => Number(await page.getAttribute("#epoch-chart", "data-points") || 0);
    const before = await points();
    await until("the loss curve to gain a point", async () => (await points()) > before);
    assert.ok(await page.locator("#epoch-chart canvas").count() > 0, "a chart is drawn");
    assert.ok((await page.textContent("#workers")).includes("w1"));

    const artifacts = process.env.ARTIFACT_DIR || dir;
    mkdirSync(artifacts, { recursive: true });
    await page.screenshot({ path: join(artifacts, "dashboard.png"), fullPage: true });
  } finally {
    if (browser) await browser.close();
    for (const c of children) c.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
});
