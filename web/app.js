// The dashboard: polls the coordinator's JSON API and redraws, without reloading the page.
"use strict";

// Worker rates are counted over this recent window, from the server's per-worker job counts.
const RATE_WINDOW_MS = 60000;
// The workers table shows the busiest ones, then a summary row for all of them.
const TOP_WORKERS = 20;

const query = new URLSearchParams(location.search);
const state = {
  run: query.get("run"),
  // Other runs of this coordinator drawn beside it (docs/OBSERVABILITY.md "Comparing runs"):
  // `/?run=A&compare=B,C`.
  compare: [...new Set((query.get("compare") || "").split(",").filter(Boolean))],
  epochChart: null,
  jobChart: null,
  throughputChart: null,     // samples/s per epoch
  metricCharts: new Map(),   // metric name → its chart
  seriesCharts: new Map(),   // series name → its chart over the whole run
  samples: new Map(),        // worker id → [{t, jobs}] over the last RATE_WINDOW_MS
  logScale: localStorage.getItem("traincoord-loss-log") === "1",
  bestEpoch: null,
};
const $ = (id) => document.getElementById(id);
const fmt = (v, d = 4) => (v === null || v === undefined ? "–" : Number(v).toFixed(d));
const text = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));

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

// Epochs and jobs are whole numbers: ticks only at whole steps, and a lone point is centred.
const wholeAxis = (el, name) => ({
  incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000],
  values: (u, splits) => { el.dataset[name] = splits.join(","); return splits.map(String); },
});
const wholeRange = (u, min, max) => (min === null ? [0, 1] : min === max ? [min - 1, max + 1] : [min, max]);

// A log axis gets ticks at 1, 2 and 5 times a power of ten.
function logSplits(u, axisIdx, min, max) {
  const out = [];
  for (let p = Math.floor(Math.log10(min)); p <= Math.ceil(Math.log10(max)); p++) {
    for (const m of [1, 2, 5]) {
      const v = Number((m * 10 ** p).toPrecision(1));
      if (v >= min * (1 - 1e-9) && v <= max * (1 + 1e-9)) out.push(v);
    }
  }
  return out;
}

// A vertical dashed line at the best epoch, labelled.
const bestEpochPlugin = {
  hooks: {
    draw: (u) => {
      if (state.bestEpoch === null || !u.scales.x || u.scales.x.min === undefined) return;
      const x = Math.round(u.valToPos(state.bestEpoch, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
      const ctx = u.ctx;
      ctx.save();
      ctx.strokeStyle = "#2a8c4a";
      ctx.lineWidth = 2 * devicePixelRatio;
      ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.fillStyle = "#2a8c4a";
      ctx.font = `${12 * devicePixelRatio}px system-ui, sans-serif`;
      ctx.fillText(`best ${state.bestEpoch}`, x + 4 * devicePixelRatio, u.bbox.top + 14 * devicePixelRatio);
      ctx.restore();
    },
  },
};

// A chart in `el`, made again only when its shape (`key`) changes.
function chart(el, key, series, { xName, yLog = false, best = false } = {}, old = null) {
  if (old && old.key === key) return old;
  if (old) old.destroy();
  const made = new uPlot({
    width: el.clientWidth || 500, height: 220,
    scales: {
      x: { time: false, range: wholeRange },
      y: yLog ? { distr: 3, log: 10 } : {},
    },
    series: [{ label: xName }, ...series],
    axes: [
      wholeAxis(el, "xticks"),
      // (uPlot's own filter would blank some of a log axis' splits: ours are all labelled.)
      yLog ? { splits: logSplits, filter: (u, s) => s, values: (u, s) => { el.dataset.yticks = s.join(","); return s.map(String); } }
        : { values: (u, s) => { el.dataset.yticks = s.join(","); return s.map((v) => String(+v.toPrecision(6))); } },
    ],
    plugins: best ? [bestEpochPlugin] : [],
  }, [[]], el);
  made.key = key;
  return made;
}

// Per epoch, the closed value of `pick(epoch)` for `set` (null where not closed).
function perEpoch(history, epochs, set, pick) {
  const closed = new Map();
  for (const e of history.epochs) if (e.set === set && e.closed) closed.set(e.epoch, e);
  return epochs.map((ep) => {
    const e = closed.get(ep);
    const v = e ? pick(e) : null;
    return v === undefined ? null : v;
  });
}

const trainDev = [
  { label: "train", stroke: "#3b7ddd", width: 2, points: { show: true } },
  { label: "dev", stroke: "#dd6b3b", width: 2, points: { show: true } },
];

// A compared run's colour, by its place in the `compare` list (its dev line dashed).
const PALETTE = ["#7b4fb8", "#2a8c4a", "#c0392b", "#b8860b", "#1a9fb5", "#d6479b", "#6b6f7a", "#8d5a2b"];
const compareList = () => state.compare.filter((r) => r !== state.run);
const colourOf = (run) => PALETTE[Math.max(0, compareList().indexOf(run)) % PALETTE.length];

// The lines of a chart over `runs` (the chosen run first, then each compared run drawn): train
// and dev of each, named after their run when there are several.
function lines(runs, style) {
  return runs.flatMap((r, i) => ["train", "dev"].map((set, k) => ({
    ...style,
    label: runs.length > 1 ? `${r.run} ${set}` : set,
    stroke: i === 0 ? trainDev[k].stroke : colourOf(r.run),
    ...(i > 0 && set === "dev" ? { dash: [6, 4] } : {}),
  })));
}
const runsKey = (runs) => runs.map((r) => r.run).join(",");

// `runs`: [{run, history, series}], the chosen run first, then the compared runs to draw.
function drawEpochs(runs, status) {
  const history = runs[0].history;
  const epochs = [...new Set(runs.flatMap((r) => r.history.epochs.map((e) => e.epoch)))].sort((a, b) => a - b);
  const el = $("epoch-chart");
  const es = status.early_stop;
  state.bestEpoch = es.best_epoch;
  el.dataset.bestEpoch = es.best_epoch === null ? "" : String(es.best_epoch);
  $("best-note").textContent = es.best_epoch === null ? "" :
    `best epoch ${es.best_epoch}: ${es.monitor} ${fmt(es.best_value)}`;
  state.epochChart = chart(el, `loss|${state.logScale}|${runsKey(runs)}`,
    lines(runs, { width: 2, points: { show: true } }),
    { xName: "epoch", yLog: state.logScale, best: true }, state.epochChart);
  // A log axis cannot show a loss of 0 or below: such points are left out there.
  const shown = (v) => (state.logScale && v !== null && v <= 0 ? null : v);
  state.epochChart.setData([epochs, ...runs.flatMap((r) =>
    ["train", "dev"].map((set) => perEpoch(r.history, epochs, set, (e) => shown(e.loss))))]);
  el.dataset.points = String(history.epochs.filter((e) => e.closed).length);
  el.dataset.scale = state.logScale ? "log" : "linear";
  drawThroughput(runs, epochs);
  drawMetrics(runs, epochs);
}

// An epoch's throughput: its samples over the time it was open (closed epochs; none when it
// opened and closed within a millisecond, or from a coordinator whose history lacks them).
const samplesPerS = (e) => (e.duration_s > 0 && typeof e.samples === "number" ? e.samples / e.duration_s : null);

// Samples/s per closed epoch, train and dev, of every run drawn (docs/OBSERVABILITY.md).
function drawThroughput(runs, epochs) {
  const el = $("throughput-chart");
  state.throughputChart = chart(el, `throughput|${runsKey(runs)}`,
    lines(runs, { width: 2, points: { show: true } }), { xName: "epoch" }, state.throughputChart);
  state.throughputChart.setData([epochs, ...runs.flatMap((r) =>
    ["train", "dev"].map((set) => perEpoch(r.history, epochs, set, samplesPerS)))]);
}

// A chart per metric the workers report (train and dev, per closed epoch), of any run drawn.
function drawMetrics(runs, epochs) {
  const names = [];
  for (const r of runs) {
    const seen = new Set();
    for (const e of r.history.epochs) for (const n of Object.keys(e.metrics)) seen.add(n);
    for (const n of seen) if (!names.includes(n)) names.push(n);
  }
  const box = $("metric-charts");
  for (const [name, c] of state.metricCharts) {
    if (!names.includes(name)) { c.destroy(); state.metricCharts.delete(name); }
  }
  const sections = [...box.children];
  if (sections.map((s) => s.dataset.metric).join("\n") !== names.join("\n")) {
    for (const c of state.metricCharts.values()) c.destroy();
    state.metricCharts.clear();
    box.innerHTML = names.map((n) =>
      `<section data-metric="${text(n)}"><h2>${text(n)} per epoch</h2><div class="chart"></div></section>`).join("");
  }
  [...box.children].forEach((section, i) => {
    const name = names[i];
    const c = chart(section.querySelector(".chart"), `metric|${name}|${runsKey(runs)}`,
      lines(runs, { width: 2, points: { show: true } }), { xName: "epoch" }, state.metricCharts.get(name));
    state.metricCharts.set(name, c);
    c.setData([epochs, ...runs.flatMap((r) =>
      ["train", "dev"].map((set) => perEpoch(r.history, epochs, set, (e) => e.metrics[name])))]);
  });
}

function drawJobs(history, current) {
  const jobs = current ? history.jobs.filter((j) => j.set === current.set && j.epoch === current.epoch) : [];
  jobs.sort((a, b) => a.n - b.n);  // in the order they were counted
  state.jobChart = chart($("job-chart"), `jobs|${current ? current.set + current.epoch : ""}`, [
    { label: current ? `${current.set} epoch ${current.epoch}` : "loss", stroke: "#4a9b5f", width: 1, points: { show: true, size: 4 } },
  ], { xName: "job" }, state.jobChart);
  state.jobChart.setData([jobs.map((_, i) => i + 1), jobs.map((j) => j.loss)]);
}

// The run's series (docs/OBSERVABILITY.md "Series"): every completion's loss and metrics over
// the whole run, downsampled by the server; a chart per name, train and dev on it, over the
// completion number n. Kept between polls: a poll asks only for the points after the newest n
// seen, and everything again when a series' stride changed (the server dropped points). A
// store per run: the chosen one's and each compared run's.
const seriesStore = (run) => ({ run, after: 0, series: new Map() });  // "set|name" → {stride, points}
let keptSeries = seriesStore(null);

async function fetchSeries(keptSeries) {
  const name = encodeURIComponent(keptSeries.run);
  for (let attempt = 0; attempt < 2; attempt++) {
    const r = await json(`/v1/runs/${name}/series?after=${keptSeries.after}`);
    const changed = r.completions < keptSeries.after || r.series.some((s) => {
      const k = keptSeries.series.get(`${s.set}|${s.name}`);
      return k && k.stride !== s.stride;
    });
    if (changed && keptSeries.after > 0) {
      Object.assign(keptSeries, { after: 0, series: new Map() });
      continue;  // (fetch them all again)
    }
    for (const s of r.series) {
      const key = `${s.set}|${s.name}`;
      const k = keptSeries.series.get(key) || { set: s.set, name: s.name, stride: s.stride, points: [] };
      k.stride = s.stride;
      for (const p of s.points) k.points.push(p);  // (kept points: after the newest seen)
      k.latest = s.latest;                         // (the latest value the stride skips, or null)
      keptSeries.series.set(key, k);
    }
    keptSeries.after = r.completions;
    break;
  }
  return keptSeries.series;
}

// A chart per series name of any run drawn (a metric only a compared run reports too), a line
// per run and set.
const seriesEls = new Map();  // series name → its chart's element
function drawSeries(runs) {
  const names = [...new Set(runs.flatMap((r) => [...r.series.values()].map((s) => s.name)))].sort((a, b) =>
    (a === "loss" ? -1 : b === "loss" ? 1 : a.localeCompare(b)));
  const box = $("series-charts");
  for (const [name, el] of seriesEls) {
    if (names.includes(name)) continue;
    const c = state.seriesCharts.get(name);
    if (c) c.destroy();
    el.parentElement.remove();
    state.seriesCharts.delete(name);
    seriesEls.delete(name);
  }
  for (const name of names) {
    let el = seriesEls.get(name);
    if (!el) {
      const section = document.createElement("section");
      section.innerHTML = `<h2>${text(name)}, whole run <span class="muted">(per completion)</span></h2><div class="series-chart"></div>`;
      box.appendChild(section);
      el = section.querySelector(".series-chart");
      el.dataset.name = name;
      seriesEls.set(name, el);
    }
    const c = chart(el, `series|${name}|${runsKey(runs)}`,
      lines(runs, { width: 1, points: { show: false }, spanGaps: true }), { xName: "completion" },
      state.seriesCharts.get(name));
    state.seriesCharts.set(name, c);
    // One x axis for all: the completion numbers of any run and set, the others null there.
    const pointsOf = (r, set) => {
      const k = r.series.get(`${set}|${name}`);
      return !k ? [] : k.latest ? [...k.points, k.latest] : k.points;
    };
    const columns = runs.flatMap((r) => ["train", "dev"].map((set) => pointsOf(r, set)));
    const xs = [...new Set(columns.flatMap((points) => points.map((p) => p[0])))].sort((a, b) => a - b);
    const at = (points) => { const m = new Map(points.map((p) => [p[0], p[2]])); return xs.map((x) => (m.has(x) ? m.get(x) : null)); };
    c.setData([xs, ...columns.map(at)]);
    el.dataset.points = String(columns[0].length + columns[1].length);  // (the chosen run's)
  }
}

// Records each worker's job and sample counts at time `t`, and returns each one's jobs per
// second over the readings of the last RATE_WINDOW_MS (null until two polls 2 s apart are in
// it); its samples per second in `sampleRates`.
const sampleRates = new Map();
function workerRates(workers, t) {
  const rates = new Map();
  const ids = new Set();
  for (const w of workers) {
    ids.add(w.id);
    const s = state.samples.get(w.id) || [];
    s.push({ t, jobs: w.jobs_done, samples: w.samples_done ?? 0 });
    while (s.length > 2 && t - s[1].t >= RATE_WINDOW_MS) s.shift();
    state.samples.set(w.id, s);
    const first = s[0], last = s[s.length - 1];
    const long = last.t - first.t >= 2000;
    rates.set(w.id, long ? (1000 * (last.jobs - first.jobs)) / (last.t - first.t) : null);
    sampleRates.set(w.id, long ? (1000 * (last.samples - first.samples)) / (last.t - first.t) : null);
  }
  for (const id of state.samples.keys()) if (!ids.has(id)) { state.samples.delete(id); sampleRates.delete(id); }
  return rates;
}

function drawWorkers(workers) {
  const rates = workerRates(workers, Date.now());
  const ranked = [...workers].sort((a, b) =>
    (rates.get(b.id) ?? -1) - (rates.get(a.id) ?? -1) || b.jobs_done - a.jobs_done || a.id - b.id);
  const shown = ranked.slice(0, TOP_WORKERS);
  const row = (w) => {
    const rate = rates.get(w.id);
    const samples = sampleRates.get(w.id);
    return `<tr class="worker" data-name="${text(w.name)}" data-rate="${rate === null ? "" : rate}" data-samples-rate="${samples === null || samples === undefined ? "" : samples}">` +
      `<td>${text(w.name)}${w.active ? "" : " (left)"}</td><td>${w.jobs_done}</td>` +
      `<td>${fmt(rate, 1)}</td><td>${fmt(samples, 1)}</td><td>${fmt(w.last_seen_ago_ms / 1000, 1)} s ago</td>` +
      `<td>${w.leases.length ? "lease " + w.leases.join(", ") : "–"}</td></tr>`;
  };
  const active = workers.filter((w) => w.active).length;
  const known = workers.map((w) => rates.get(w.id)).filter((r) => r !== null);
  const total = known.length ? known.reduce((a, b) => a + b, 0) : null;
  const jobs = workers.reduce((a, w) => a + w.jobs_done, 0);
  const knownSamples = workers.map((w) => sampleRates.get(w.id)).filter((r) => r !== null && r !== undefined);
  const totalSamples = knownSamples.length ? knownSamples.reduce((a, b) => a + b, 0) : null;
  const leases = workers.reduce((a, w) => a + w.leases.length, 0);
  const more = workers.length - shown.length;
  $("workers").innerHTML =
    `<tr><th>worker</th><th>jobs</th><th>jobs/s (last ${RATE_WINDOW_MS / 1000} s)</th><th>samples/s</th><th>last seen</th><th>current job</th></tr>` +
    shown.map(row).join("") +
    `<tr class="summary" data-workers="${workers.length}" data-active="${active}" data-rate="${total === null ? "" : total}">` +
    `<td>all ${workers.length} (${active} active)${more > 0 ? `; ${more} more not shown` : ""}</td>` +
    `<td>${jobs}</td><td>${fmt(total, 1)}</td><td>${fmt(totalSamples, 1)}</td><td></td><td>${leases} leases</td></tr>`;
}

// Checkpoint cuts (docs/SEMANTICS.md): the group that trains now and its generation, the latest
// complete cut, and what restores did. A field the coordinator does not send shows as "–".
function drawCuts(status) {
  const cuts = status.cuts || {};
  const counters = status.counters || {};
  const latest = cuts.latest || null;
  const el = $("cuts");
  const n = (v) => (v === null || v === undefined ? "–" : text(v));
  el.dataset.generation = n(status.generation);
  el.dataset.group = status.group ?? "";
  el.dataset.count = n(cuts.count);
  el.dataset.latest = latest ? String(latest.id) : "";
  el.dataset.restores = n(counters.restores);
  el.dataset.withdrawn = n(counters.jobs_withdrawn);
  const latestText = !latest ? "none yet" :
    `<b>cut ${n(latest.id)}</b>` +
    (latest.epoch !== undefined ? ` at ${text(latest.set)} epoch ${n(latest.epoch)}` : "") +
    `: ${n(latest.jobs_done)} jobs done, ${n(latest.partial_jobs)} partly trained` +
    ` (${n(latest.partial_batches)} batches)` +
    (typeof latest.completed_ago_ms === "number" ? `, ${fmt(latest.completed_ago_ms / 1000, 1)} s ago` : "");
  el.innerHTML = `<dl class="facts">` +
    `<dt>group</dt><dd id="cuts-group">${status.group ? text(status.group) : "none"}` +
    ` <span class="muted">(generation ${n(status.generation)})</span></dd>` +
    `<dt>cuts kept</dt><dd id="cuts-count">${n(cuts.count)} <span class="muted">(keeps the last ${n(cuts.keep)}; ${n(counters.cuts)} taken)</span></dd>` +
    `<dt>latest cut</dt><dd id="cuts-latest">${latestText}</dd>` +
    `<dt>restores</dt><dd id="cuts-restores">${n(counters.restores)}</dd>` +
    `<dt>jobs withdrawn</dt><dd id="cuts-withdrawn">${n(counters.jobs_withdrawn)}` +
    ` <span class="muted">(${n(counters.leases_voided)} leases voided)</span></dd></dl>`;
}

// Step mode (docs/SEMANTICS.md "Step mode", docs/API.md `steps`): each set's latest epoch in
// steps, what its plan was made with and predicts, the cost model and each rank's pace; hidden
// for a run that hands out jobs.
function drawSteps(status) {
  const steps = status.steps;
  $("steps-section").hidden = !steps;
  if (!steps) return;
  const n = (v) => (v === null || v === undefined ? "–" : text(v));
  const pct = (v) => (typeof v === "number" ? `${(100 * v).toFixed(1)}%` : "–");
  const sets = (steps.sets || []).map((s) =>
    `<tr data-set="${text(s.set)}"><td>${text(s.set)} epoch ${n(s.epoch)}${s.closed ? " (closed)" : ""}</td>` +
    `<td class="steps-done">${n(s.done)} / ${n(s.planned)}</td>` +
    `<td>${n(s.batches_in_flight)} in flight, ${n(s.batches_queued)} queued</td>` +
    `<td>${s.planned_with ? text(s.planned_with) : "fixed batches"}</td>` +
    `<td class="steps-straggling">${s.predicted ? fmt(s.predicted.straggling, 3) : "–"}</td>` +
    `<td>${s.predicted ? pct(s.predicted.padding) : "–"}</td></tr>`).join("");
  const m = status.cost_model;
  const model = !m ? "no batch time reported yet" :
    `${m.fitted ? `<b>${text(m.model)}</b>` : "not fitted yet"} from ${n(m.reports)} reports` +
    ` (${n(m.ranks)} ranks)`;
  const ranks = (steps.ranks || []).map((r) =>
    `<tr data-rank="${n(r.rank)}"><td>rank ${n(r.rank)}</td><td>${fmt(r.samples_per_s, 1)}</td>` +
    `<td>${r.speed === null || r.speed === undefined ? "–" : fmt(r.speed, 2)}</td><td>${n(r.batches)}</td></tr>`).join("");
  const more = steps.ranks_total > (steps.ranks || []).length ? `<tr><td colspan="4" class="muted">${steps.ranks_total - steps.ranks.length} more ranks not shown</td></tr>` : "";
  const el = $("steps");
  el.dataset.worldSize = n(steps.world_size);
  el.innerHTML =
    `<table><tr><th>epoch</th><th>steps done</th><th>batches</th><th>planned with</th><th>predicted straggling</th><th>padding</th></tr>${sets}</table>` +
    (status.cost_model !== undefined ? `<p>cost model: <span id="steps-model">${model}</span></p>` : "") +
    (ranks ? `<table><tr><th>rank</th><th>samples/s</th><th>speed</th><th>batches</th></tr>${ranks}${more}</table>` : "");
}

// The events of checkpoint cuts stand out from the others (a coloured mark per kind).
const CHECKPOINT_EVENTS = new Set(["cut_taken", "restored", "group_started"]);

function drawEvents(events) {
  $("events").innerHTML = events.slice(-12).reverse().map((e) =>
    `<tr class="event${CHECKPOINT_EVENTS.has(e.kind) ? " checkpoint" : ""}" data-kind="${text(e.kind)}">` +
    `<td class="muted">${fmt(e.ago_ms / 1000, 1)} s ago</td><td class="kind">${text(e.kind)}</td>` +
    `<td>${text(e.text)}</td></tr>`).join("");
}

function draw(status, runs) {
  $("title").innerHTML = `run <b>${text(status.run)}</b> — <span class="state">${text(status.state)}</span>` +
    (status.reason ? ` <span class="muted">(${text(status.reason)})</span>` : "") +
    // How it hands out work: jobs, steps, or auto until its first acquire chooses.
    (status.mode ? ` <span class="mode muted" title="how the run hands out work">${text(status.mode)}</span>` : "");
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
  $("eta").textContent = `${fmt(p.jobs_per_s, 1)} jobs/s since the start` + (p.eta_s !== null ? `, ETA ${Math.round(p.eta_s)} s` : "");
  const es = status.early_stop;
  $("early-stop").innerHTML = `rule <b>${text(es.rule)}</b> on ${text(es.monitor)}; ` +
    (es.best_epoch !== null ? `best epoch <b>${es.best_epoch}</b> (${fmt(es.best_value)}), ` : "") +
    `wait ${es.wait}` + (es.stopped ? `; <b>stopped</b>: ${text(es.reason)}` : "");
  drawWorkers(status.workers);
  drawCuts(status);
  drawSteps(status);
  drawEvents(status.events);
  drawEpochs(runs, status);
  drawJobs(runs[0].history, c);
  drawSeries(runs);
}

// The run's history as this page keeps it between polls, so that a poll fetches only what
// changed (docs/OBSERVABILITY.md): every epoch by its position in opening order, and the latest
// completions with the number of the newest seen. Closed epochs do not change; a restore (which
// may reopen them) gives the run a new generation, and the page then fetches it all again.
const HISTORY_PAGE = 5000;   // epochs per request
const JOBS_KEPT = 4096;      // completions kept, as the coordinator keeps them
// A compared run's history is asked without completions (jobs_after past any): its epochs only.
const NO_JOBS = Number.MAX_SAFE_INTEGER;
const historyStore = (run) => ({ run, generation: null, epochs: [], jobs: [], jobsSeen: 0 });
let kept = historyStore(null);

function forget(kept, generation) {
  Object.assign(kept, { generation, epochs: [], jobs: [], jobsSeen: 0 });
}

// Brings `kept` up to date: the epochs from the oldest one not closed when last seen, and the
// completions after the newest seen (none with `withJobs` false); a page at a time (bounded)
// until the history's end.
async function fetchHistory(kept, withJobs = true) {
  const name = encodeURIComponent(kept.run);
  for (let page = 0; page < 100; page++) {
    let from = kept.epochs.findIndex((e) => !e.closed);
    if (from < 0) from = kept.epochs.length;
    const h = await json(`/v1/runs/${name}/history?from=${from}&limit=${HISTORY_PAGE}&jobs_after=${withJobs ? kept.jobsSeen : NO_JOBS}`);
    if (h.generation !== kept.generation || h.epochs_total < kept.epochs.length || h.jobs_total < kept.jobsSeen) {
      const first = kept.generation === null && kept.epochs.length === 0 && kept.jobsSeen === 0;
      forget(kept, h.generation);
      if (!first) continue;  // (fetch it all again)
    }
    kept.epochs.length = Math.min(kept.epochs.length, h.epochs_from);
    for (const e of h.epochs) kept.epochs.push(e);
    for (const j of h.jobs) kept.jobs.push(j);
    if (kept.jobs.length > JOBS_KEPT) kept.jobs.splice(0, kept.jobs.length - JOBS_KEPT);
    kept.jobsSeen = h.jobs_total;
    if (h.epochs_from + h.epochs.length >= h.epochs_total) break;
  }
  return { epochs: kept.epochs, jobs: kept.jobs };
}

// High availability (docs/HA.md "Watching it"): who leads, this coordinator's role, the
// journal's lag, the takeovers; hidden with one coordinator alone.
function drawCoordinator(c) {
  $("ha").hidden = !c || c.mode !== "ha";
  if ($("ha").hidden) return;
  const leader = c.leader ? `<a href="${text(c.leader.url)}/">${text(c.leader.url)}</a> (term ${c.leader.term})` : "none known (an election is due)";
  const j = c.journal;
  const facts = [
    ["this coordinator", `${text(c.url)}: <span class="state" id="ha-role">${c.role === "leader" ? "leader" : "standby"}</span>`],
    ["leader", `<span id="ha-leader">${leader}</span>`],
    ["journal head", j ? `record ${j.head_seq} (etcd revision ${j.head_revision}), seen ${fmt(j.seen_ms_ago / 1000, 1)} s ago; a takeover replays ≤ ${j.replay_records} records` : "–"],
    ["takeovers", `<span id="ha-takeovers">${c.takeovers}</span>` + (c.last_takeover_ms ? `, last ${new Date(c.last_takeover_ms).toLocaleString()} (serving ${fmt(c.last_takeover_s, 2)} s after winning)` : "") + `; step-downs ${c.stepdowns}`],
  ];
  $("ha-facts").innerHTML = facts.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
}

// High availability, leadership per run (docs/HA.md "Leadership per run"): which coordinator
// leads which run, under which term, and where each run's journal stands, from
// /v1/coordinator's runs[]; hidden with one coordinator alone.
function drawRunLeaders(c) {
  const runs = c && c.mode === "ha" && Array.isArray(c.runs) ? c.runs : null;
  $("ha-runs").hidden = !runs;
  if (!runs) return;
  const leaderOf = (r) => (r.role === "leader" ? `${text(r.leader)} (this coordinator)`
    : r.leader ? `<a href="${text(r.leader)}/?run=${encodeURIComponent(r.run)}">${text(r.leader)}</a>`
      : "none known (an election is due)");
  $("ha-runs-table").innerHTML =
    "<tr><th>run</th><th>leader</th><th>term</th><th>journal head</th><th>a takeover replays</th></tr>" +
    runs.map((r) => `<tr data-run="${text(r.run)}" data-role="${text(r.role)}"><td>${text(r.run)}</td>` +
      `<td class="leader">${leaderOf(r)}</td><td class="term">${r.term > 0 ? r.term : "–"}</td>` +
      `<td>record ${r.head_seq} (etcd revision ${r.head_revision})</td><td>${r.replay_records} records</td></tr>`).join("");
}

// The page's address: the chosen run and the compared ones (`?run=A&compare=B,C`).
function address(run, compare) {
  const others = compare.filter((r) => r !== run);
  return `?run=${encodeURIComponent(run)}` + (others.length ? `&compare=${others.map(encodeURIComponent).join(",")}` : "");
}

// A run in the header: one led elsewhere (HA) links to its leader's dashboard.
function runLink(r) {
  if (r.led_here !== false) return `<a href="${address(r.run, state.compare)}">${text(r.run)}</a>`;
  if (!r.leader) return `<a class="muted" title="no leader known now" href="?run=${encodeURIComponent(r.run)}">${text(r.run)}</a>`;
  return `<a title="led by ${text(r.leader)}" href="${text(r.leader)}/?run=${encodeURIComponent(r.run)}">${text(r.run)} ↗</a>`;
}

// Comparing runs (docs/OBSERVABILITY.md "Comparing runs"): each compared run's history (its
// epochs only) and series, kept between polls as the chosen run's are, so that its poll asks
// only for what changed. A run that cannot be fetched (gone, an error) is drawn no more and
// marked in the list; it is fetched whole again once it answers.
const compared = new Map();  // run → {history, series, error, ok}

async function fetchCompared() {
  const list = compareList();
  for (const run of [...compared.keys()]) if (!list.includes(run)) compared.delete(run);
  await Promise.all(list.map(async (run) => {
    let c = compared.get(run);
    if (!c) compared.set(run, c = { run, history: historyStore(run), series: seriesStore(run), error: null, ok: false });
    try {
      await Promise.all([fetchHistory(c.history, false), fetchSeries(c.series)]);
      Object.assign(c, { error: null, ok: true });
    } catch (e) {
      Object.assign(c, { error: e.message, ok: false, history: historyStore(run), series: seriesStore(run) });
    }
  }));
  return compareList().map((run) => compared.get(run)).filter((c) => c && c.ok)
    .map((c) => ({ run: c.run, history: c.history, series: c.series.series }));
}

// Beside the runs, a checkbox for each other run of this coordinator: checked, it is drawn on
// the charts beside the chosen run. A compared run not listed any more, or that fails, says so.
let compareHtml = null;
function drawCompare(runs) {
  const here = runs.filter((r) => r.led_here !== false).map((r) => r.run);
  const options = [...here, ...state.compare.filter((r) => !here.includes(r))].filter((r) => r !== state.run);
  const html = !options.length ? "" : `<span class="muted">compare:</span>` + options.map((run) => {
    const c = compared.get(run);
    const on = compareList().includes(run);
    const note = !here.includes(run) ? " (gone)" : c && c.error ? " (unavailable)" : "";
    return `<label data-run="${text(run)}"${c && c.error ? ` title="${text(c.error)}"` : ""}>` +
      `<input type="checkbox" value="${text(run)}"${on ? " checked" : ""}>` +
      (on ? `<i style="background:${colourOf(run)}"></i>` : "") + `${text(run)}${note}</label>`;
  }).join("");
  if (html !== compareHtml) { $("compare").innerHTML = html; compareHtml = html; }
}

$("compare").addEventListener("change", (ev) => {
  const run = ev.target.value;
  state.compare = state.compare.filter((r) => r !== run);
  if (ev.target.checked) state.compare.push(run);
  if (state.run) window.history.replaceState(null, "", location.pathname + address(state.run, state.compare));
  tick();  // (at once)
});

// A poll's requests go out together: the coordinator's and the runs' first, then the chosen
// run's status, history and series and each compared run's.
async function poll() {
  // (An older coordinator has no /v1/coordinator.)
  const coordinatorReply = json("/v1/coordinator").catch(() => null);
  const runsReply = json("/v1/runs");
  runsReply.catch(() => {});  // (its error is shown below)
  const coordinator = await coordinatorReply;
  drawCoordinator(coordinator);
  drawRunLeaders(coordinator);
  try {
    const runs = (await runsReply).runs;
    if (!state.run && runs.length) state.run = (runs.find((r) => r.led_here !== false) || runs[0]).run;
    $("runs").innerHTML = runs.map(runLink).join("");
    const chosen = runs.find((r) => r.run === state.run);
    if (chosen && chosen.led_here === false) {
      // Another coordinator serves it (HA): say which, show nothing stale of it.
      const standby = coordinator && coordinator.role !== "leader" ? "this coordinator stands by: " : "";
      $("progress-label").innerHTML = `${standby}run ${text(chosen.run)} is served by ` + (chosen.leader
        ? `its leader <a href="${text(chosen.leader)}/?run=${encodeURIComponent(chosen.run)}">${text(chosen.leader)}</a>`
        : "its leader, once one is elected");
    } else if (state.run) {
      // At once: the status without its list of epochs (the history has them), what changed of
      // the history and series, and what changed of each compared run's.
      const others = fetchCompared();
      const run = state.run;
      if (kept.run !== run) kept = historyStore(run);
      if (keptSeries.run !== run) keptSeries = seriesStore(run);
      // (Each settled before the next poll, so that no fetch outlives its poll.)
      const [replies, more] = await Promise.all([Promise.allSettled([
        json(`/v1/runs/${encodeURIComponent(run)}?epochs=0`), fetchHistory(kept), fetchSeries(keptSeries)]), others]);
      const failed = replies.find((r) => r.status === "rejected");
      if (failed) throw failed.reason;
      const [status, history, series] = replies.map((r) => r.value);
      const drawn = [{ run, history, series }, ...more];
      draw(status, drawn);
      state.last = { status, runs: drawn };
    }
    drawCompare(runs);
  } catch (e) {
    $("progress-label").textContent = `cannot reach the coordinator: ${e.message}`;
  }
}

// A poll a second; tick() polls at once (after the poll under way, if one is).
let polling = false, pollAgain = false, pollTimer = null;
async function tick() {
  clearTimeout(pollTimer);
  if (polling) { pollAgain = true; return; }
  polling = true;
  try {
    await poll();
  } finally {
    polling = false;
    pollTimer = setTimeout(tick, pollAgain ? 0 : 1000);
    pollAgain = false;
  }
}

$("loss-log").checked = state.logScale;
$("loss-log").addEventListener("change", (ev) => {
  state.logScale = ev.target.checked;
  localStorage.setItem("traincoord-loss-log", state.logScale ? "1" : "0");
  if (state.last) drawEpochs(state.last.runs, state.last.status);
});
tick();
