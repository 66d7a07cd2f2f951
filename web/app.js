// The dashboard: polls the coordinator's JSON API and redraws, without reloading the page.
"use strict";

const state = { run: new URLSearchParams(location.search).get("run"), epochChart: null, jobChart: null };
const $ = (id) => document.getElementById(id);
const fmt = (v, d = 4) => (v === null || v === undefined ? "–" : Number(v).toFixed(d));
const text = (s) => String(s).replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" }[c]));

// With tokens on, open the dashboard as http://HOST:PORT/#token=ADMIN_TOKEN; it is kept in this
// browser's local storage, never in the URL sent to the server.
const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromHash) { localStorage.setItem("traincoord-token", fromHash); history.replaceState(null, "", location.pathname + location.search); }
const token = localStorage.getItem("traincoord-token");

async function json(path) {
  const r = await fetch(path, { cache: "no-store", headers: token ? { Authorization: `Bearer ${token}` } : {} });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function chart(el, title, series, old) {
  const width = el.clientWidth || 500;
  const labels = series.map((s) => s.label).join("|");
  if (old && old.labels === labels) return old;
  if (old) old.destroy();
  const made = new uPlot({
    width, height: 220, title,
    scales: { x: { time: false } },
    series: [{ label: "x" }, ...series],
    axes: [{}, {}],
  }, [[]], el);
  made.labels = labels;
  return made;
}

function drawEpochs(history) {
  const epochs = [...new Set(history.epochs.map((e) => e.epoch))].sort((a, b) => a - b);
  const loss = (set, ep) => {
    const e = history.epochs.find((x) => x.set === set && x.epoch === ep && x.closed);
    return e ? e.loss : null;
  };
  state.epochChart = chart($("epoch-chart"), "", [
    { label: "train", stroke: "#3b7ddd", width: 2, points: { show: true } },
    { label: "dev", stroke: "#dd6b3b", width: 2, points: { show: true } },
  ], state.epochChart);
  state.epochChart.setData([epochs, epochs.map((e) => loss("train", e)), epochs.map((e) => loss("dev", e))]);
  $("epoch-chart").dataset.points = String(history.epochs.filter((e) => e.closed).length);
}

function drawJobs(history, current) {
  const jobs = current ? history.jobs.filter((j) => j.set === current.set && j.epoch === current.epoch) : [];
  jobs.sort((a, b) => b.ago_ms - a.ago_ms);
  state.jobChart = chart($("job-chart"), "", [
    { label: current ? `${current.set} epoch ${current.epoch}` : "loss", stroke: "#4a9b5f", width: 1, points: { show: true, size: 4 } },
  ], state.jobChart);
  state.jobChart.setData([jobs.map((_, i) => i + 1), jobs.map((j) => j.loss)]);
}

function draw(status, history) {
  $("title").innerHTML = `run <b>${text(status.run)}</b> — <span class="state">${text(status.state)}</span>` +
    (status.reason ? ` <span class="muted">(${text(status.reason)})</span>` : "");
  const c = status.current;
  const p = status.progress;
  if (c) {
    const done = c.done + c.failed;
    $("progress").style.width = `${(100 * done) / Math.max(1, c.jobs)}%`;
    $("progress-label").textContent = `${c.set} epoch ${c.epoch}: ${done} / ${c.jobs} jobs, ${c.running} running`;
  } else {
    $("progress").style.width = "100%";
    $("progress-label").textContent = `${status.state}: ${p.jobs_done} / ${p.jobs_planned} jobs`;
  }
  $("progress-label").dataset.done = String(p.jobs_done);
  $("eta").textContent = `${fmt(p.jobs_per_s, 1)} jobs/s` + (p.eta_s !== null ? `, ETA ${Math.round(p.eta_s)} s` : "");
  const es = status.early_stop;
  $("early-stop").innerHTML = `rule <b>${text(es.rule)}</b> on ${text(es.monitor)}; ` +
    (es.best_epoch !== null ? `best epoch <b>${es.best_epoch}</b> (${fmt(es.best_value)}), ` : "") +
    `wait ${es.wait}` + (es.stopped ? `; <b>stopped</b>: ${text(es.reason)}` : "");
  $("workers").innerHTML = "<tr><th>worker</th><th>jobs</th><th>rate/s</th><th>last seen</th><th>current job</th></tr>" +
    status.workers.map((w) => {
      const elapsed = Math.max(1, (Date.now() - state.started) / 1000);
      return `<tr><td>${text(w.name)}${w.active ? "" : " (left)"}</td><td>${w.jobs_done}</td>` +
        `<td>${fmt(w.jobs_done / elapsed, 1)}</td><td>${fmt(w.last_seen_ago_ms / 1000, 1)} s ago</td>` +
        `<td>${w.leases.length ? "lease " + w.leases.join(", ") : "–"}</td></tr>`;
    }).join("");
  $("events").innerHTML = status.events.slice(-12).reverse().map((e) =>
    `<tr><td class="muted">${fmt(e.ago_ms / 1000, 1)} s ago</td><td>${text(e.kind)}</td><td>${text(e.text)}</td></tr>`).join("");
  drawEpochs(history);
  drawJobs(history, c);
}

async function tick() {
  try {
    const runs = (await json("/v1/runs")).runs;
    $("runs").innerHTML = runs.map((r) => `<a href="?run=${encodeURIComponent(r.run)}">${text(r.run)}</a>`).join("");
    if (!state.run && runs.length) state.run = runs[0].run;
    if (state.run) {
      const name = encodeURIComponent(state.run);
      const [status, history] = await Promise.all([json(`/v1/runs/${name}`), json(`/v1/runs/${name}/history`)]);
      draw(status, history);
    }
  } catch (e) {
    $("progress-label").textContent = `cannot reach the coordinator: ${e.message}`;
  }
  setTimeout(tick, 1000);
}

state.started = Date.now();
tick();
