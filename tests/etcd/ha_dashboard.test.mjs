// The dashboard's "Coordinators" panel in a real browser (Debian's chromium, playwright-core
// from npm) against a real etcd member and two coordinators on loopback (docs/HA.md "Watching
// it"): on the leader it says "leader" and names itself; on the standby it says "standby", names
// the leader, and says that the runs are served there; after the leader is killed, the former
// standby's page says "leader" with one takeover. The "Leaders of the runs" panel shows the
// run's leader and term as the server's /v1/coordinator says them, before and after the
// takeover, and the standby's header links the run to its leader's dashboard. Every process is
// killed by its PID at the end.
//   TRAINCOORD_BIN=build/traincoord node --test tests/etcd/ha_dashboard.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRequire } from "node:module";

const require = createRequire(new URL("../../web/package.json", import.meta.url));
const { chromium } = require("playwright-core");

const RUN = `
name = "hadash"
[data]
train_batches = 20
dev_batches = 2
[schedule]
epochs = 2
`;

const freePort = () => new Promise((resolve) => {
  const s = createServer();
  s.listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => resolve(port)); });
});

async function until(what, fn, ms = 30000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const v = await fn().catch(() => false);
    if (v) return v;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out waiting for ${what}`);
}

function startCoordinator(config, journal) {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.env.TRAINCOORD_BIN, ["serve", "--config", config, "--journal", journal,
      "--listen", "127.0.0.1:0"], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    const timer = setTimeout(() => reject(new Error(`coordinator did not start: ${out}`)), 20000);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc, url: m[1] }); }
    });
  });
}

// The run's row of the "Leaders of the runs" panel equals what `url`'s /v1/coordinator says of it.
async function runRowMatchesServer(page, url, run) {
  const c = await (await fetch(`${url}/v1/coordinator`)).json();
  const r = c.runs.find((x) => x.run === run);
  if (!r || !r.leader) return false;
  const row = await page.evaluate((name) => {
    const tr = document.querySelector(`#ha-runs-table tr[data-run="${name}"]`);
    return tr && { leader: tr.querySelector(".leader").textContent, term: tr.querySelector(".term").textContent, role: tr.dataset.role };
  }, run);
  return row && row.leader.startsWith(r.leader) && row.term === String(r.term) && row.role === r.role ? r : false;
}

test("the Coordinators panel says who leads, on the leader and on the standby", async () => {
  const dir = mkdtempSync(join(tmpdir(), "traincoord-hadash-"));
  const children = [];
  let browser;
  try {
    const client = await freePort(), peer = await freePort();
    const etcd = spawn("etcd", ["--name", "m1", "--data-dir", join(dir, "m1.etcd"),
      "--listen-client-urls", `http://127.0.0.1:${client}`, "--advertise-client-urls", `http://127.0.0.1:${client}`,
      "--listen-peer-urls", `http://127.0.0.1:${peer}`, "--initial-advertise-peer-urls", `http://127.0.0.1:${peer}`,
      "--initial-cluster", `m1=http://127.0.0.1:${peer}`, "--logger=zap", `--log-outputs=${join(dir, "m1.log")}`],
      { stdio: "ignore" });
    children.push(etcd);
    await until("etcd", async () => (await (await fetch(`http://127.0.0.1:${client}/health`)).text()).includes("true"));
    const config = join(dir, "hadash.toml");
    writeFileSync(config, RUN);
    const journal = `etcd://127.0.0.1:${client}/hadash`;
    const a = await startCoordinator(config, journal);
    children.push(a.proc);
    await until("a to lead", async () => (await fetch(`${a.url}/v1/runs/hadash`)).status === 200);
    const b = await startCoordinator(config, journal);
    children.push(b.proc);

    browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-gpu"] });
    const page = await browser.newPage();
    await page.goto(a.url + "/");
    await page.waitForFunction(() => document.getElementById("ha-role")?.textContent === "leader");
    assert.equal(await page.isVisible("#ha"), true);
    assert.match(await page.textContent("#ha-leader"), new RegExp(a.url.replace(/\./g, "\\.")));
    await page.waitForFunction(() => document.getElementById("title").textContent.includes("hadash"));
    assert.equal(await page.isVisible("#ha-runs"), true);
    const led = await until("a's leaders panel to match a", () => runRowMatchesServer(page, a.url, "hadash"), 10000);
    assert.equal(led.leader, a.url);
    assert.equal(led.role, "leader");

    const standby = await browser.newPage();
    await standby.goto(b.url + "/");
    await standby.waitForFunction((url) => document.getElementById("ha-role")?.textContent === "standby" &&
      document.getElementById("ha-leader").textContent.includes(url), a.url);
    assert.match(await standby.textContent("#progress-label"), /stands by/);
    assert.equal(await standby.textContent("#ha-takeovers"), "0");
    const seen = await until("b's leaders panel to match b", () => runRowMatchesServer(standby, b.url, "hadash"), 10000);
    assert.equal(seen.leader, a.url);
    assert.equal(seen.term, led.term);
    assert.equal(await standby.getAttribute("#runs a", "href"), `${a.url}/?run=hadash`);

    a.proc.kill("SIGKILL");
    await standby.waitForFunction(() => document.getElementById("ha-role")?.textContent === "leader",
      null, { timeout: 30000 });
    assert.equal(await standby.textContent("#ha-takeovers"), "1");
    const took = await until("b's leaders panel to show b leading", async () => {
      const r = await runRowMatchesServer(standby, b.url, "hadash");
      return r && r.leader === b.url ? r : false;
    }, 10000);
    assert.ok(took.term > led.term, `term ${took.term} after ${led.term}`);
    await standby.waitForFunction(() => document.getElementById("title").textContent.includes("hadash"));
  } finally {
    if (browser) await browser.close();
    for (const c of children) c.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
});
