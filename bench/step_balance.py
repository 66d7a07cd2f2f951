"""Issue 32's benchmark: a synchronous group on length-skewed data, three ways, side by side.

W ranks (default 8) are processes on loopback in one torch.distributed gloo group. Each step,
every rank "trains" its batch by sleeping the batch's padded cost (a + b·n·L + c·n·L², n samples
padded to the longest, L; quadratic in length, as attention is) times --scale seconds per unit,
then joins a real all-reduce of a small tensor, as DDP does at the end of every backward. The
set is synthetic: --samples lengths drawn log-normal like utterance durations (median 6 s,
sigma 0.7, truncated to [1, 35] s; seeded). Compared, on the same processes and lengths:

  1. DistributedSampler: torch's own (shuffled, padded by repeating), fixed-size batches padded
     to their longest; the batch size is the one whose mean padded batch costs the budget;
  2. unsynchronised bucketing, as Lhotse's DynamicBucketingSampler by default: each rank
     buckets its own DistributedSampler shard into 30 buckets of equal total duration,
     shuffles within them, and forms batches from a bucket drawn at random (weighted by what
     it has left) under a padded-duration budget (n·L, Lhotse's max_duration), the one whose
     mean batch costs the budget; step k is every rank's k-th batch, a rank out of batches
     idles in the all-reduce (as under join());
  3. traincoord's step mode, cost-balanced (see `--help` of traincoord: `[data] lengths`,
     `batch_budget`): a real coordinator on loopback plans every step; each rank reports its
     batch time, and the coordinator fits the cost model (per rank) from them; the first epoch
     is planned with the declared cost, the figures are those of the second.

Each way runs once as is and once with one rank slowed 2× (its sleeps doubled). Figures
(docs/PERFORMANCE.md, "Step mode figures"): E = useful ÷ (W × Σ step times), E_net = the same
with each step's all-reduce taken out (the all-reduce call of the rank that arrived last), S =
mean over steps of slowest ÷ mean rank batch time, P = 1 − useful ÷ padded, and the epoch time;
every sample is checked to be trained exactly once per epoch (DistributedSampler repeats a few
to even the shards out: counted, not an error).

    /usr/bin/python3 bench/step_balance.py [--ranks 8] [--samples 20000] [--budget 400]
        [--scale 1e-4] [--ways sampler,buckets,traincoord] [--seed 1]
"""

import argparse
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

A, B, C = 0.5, 1.0, 0.05  # the true cost of a batch: A + B·n·L + C·n·L² (units)
LHOTSE_BUCKETS = 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synthetic_lengths(samples, seed, median=6.0, sigma=0.7, shortest=1.0, longest=35.0):
    rng = random.Random(seed)
    mu, out = math.log(median), []
    while len(out) < samples:
        x = math.exp(rng.gauss(mu, sigma))
        if shortest <= x <= longest:
            out.append(round(x, 3))
    return out


def padded(lengths, batch):
    """The padded cost of a batch (units): A + n·(B·L + C·L²)."""
    if not batch:
        return 0.0
    longest = max(lengths[i] for i in batch)
    return A + len(batch) * (B * longest + C * longest * longest)


def useful(lengths, batch):
    return sum(B * lengths[i] + C * lengths[i] ** 2 for i in batch)


# ---- the two baselines' plans (pure, the same on every rank) ----------------------------------

def shard(n, ranks, rank, seed, epoch):
    """DistributedSampler's shard, computed as torch does (shuffled, padded by repeating)."""
    import torch
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    total = -(-n // ranks) * ranks
    order += order[:total - n]
    return order[rank:total:ranks]


def sampler_plan(lengths, ranks, rank, seed, epoch, batch_size):
    s = shard(len(lengths), ranks, rank, seed, epoch)
    return [s[i:i + batch_size] for i in range(0, len(s), batch_size)]


def lhotse_boundaries(lengths, buckets):
    """Bucket upper bounds of equal total duration (Lhotse's estimate_duration_buckets)."""
    ordered = sorted(lengths)
    per = sum(ordered) / buckets
    bounds, acc = [], 0.0
    for x in ordered:
        acc += x
        if acc >= per * (len(bounds) + 1) and len(bounds) < buckets - 1:
            bounds.append(x)
    return bounds


def bucketing_plan(lengths, ranks, rank, seed, epoch, duration_budget, bounds):
    import bisect
    rng = random.Random(seed * 1_000_003 + epoch * 1009 + rank)
    buckets = [[] for _ in range(len(bounds) + 1)]
    for i in shard(len(lengths), ranks, rank, seed, epoch):
        buckets[bisect.bisect_left(bounds, lengths[i])].append(i)
    for b in buckets:
        rng.shuffle(b)
    batches = []
    while any(buckets):
        live = [b for b in buckets if b]
        b = rng.choices(live, weights=[len(x) for x in live])[0]
        batch, longest = [], 0.0
        while b and (not batch or (len(batch) + 1) * max(longest, lengths[b[-1]]) <= duration_budget):
            i = b.pop()
            batch.append(i)
            longest = max(longest, lengths[i])
        batches.append(batch)
    return batches


def mean_padded(lengths, plans):
    costs = [padded(lengths, b) for plan in plans for b in plan if b]
    return sum(costs) / len(costs)


def fit_batch_size(lengths, ranks, seed, budget):
    """The batch size whose mean padded batch costs closest to the budget."""
    def mean(bs):
        return mean_padded(lengths, [sampler_plan(lengths, ranks, r, seed, 0, bs) for r in range(ranks)])
    low, high = 1, max(1, len(lengths) // ranks)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if mean(mid) <= budget else (low, mid - 1)
    return low + 1 if abs(mean(low + 1) - budget) < abs(mean(low) - budget) else low


def fit_duration_budget(lengths, ranks, seed, budget, bounds):
    def mean(d):
        return mean_padded(lengths, [bucketing_plan(lengths, ranks, r, seed, 0, d, bounds)
                                     for r in range(ranks)])
    low, high = 0.0, 35.0
    while mean(high) < budget and high < 1e9:  # (a small set's whole buckets may cost less)
        high *= 2
    for _ in range(20):
        mid = (low + high) / 2
        low, high = (mid, high) if mean(mid) < budget else (low, mid)
    return low


# ---- one rank --------------------------------------------------------------------------------

def rank_main(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    setup = json.loads(Path(args.setup).read_text())
    lengths = setup["lengths"]
    tensor = torch.zeros(16)
    results = []

    def step(batch, speed):
        """Trains one batch: returns (batch seconds, all-reduce seconds, end time, start
        time, the sleep asked for)."""
        t0 = time.perf_counter()
        cost = padded(lengths, batch) * args.scale * speed
        if cost > 0:
            time.sleep(cost)
        t1 = time.perf_counter()
        dist.all_reduce(tensor)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, t2, t0, cost

    def record(way, slow, epoch, batches, times, start, held=None):
        # held: {row: seconds this rank spent, after that row's step, on the benchmark's own
        # business (rank 0's status poll), taken out of the next step's time by figures()}
        rows = [{"samples": b, "batch_s": bt, "allreduce_s": ar, "end": end, "t0": t0,
                 "asked_s": asked, "held_s": (held or {}).get(i, 0.0)}
                for i, (b, (bt, ar, end, t0, asked)) in enumerate(zip(batches, times))]
        gathered = [None] * world
        dist.all_gather_object(gathered, {"rank": rank, "start": start, "rows": rows})
        if rank == 0:
            results.append({"way": way, "slow": slow, "epoch": epoch, "ranks": gathered})

    def note(entry):  # (rank 0 only: what the coordinator showed)
        results.append(entry)

    for way in args.ways.split(","):
        for slow in (False, True):
            speed = 2.0 if slow and rank == world - 1 else 1.0
            if way in ("sampler", "buckets"):
                if way == "sampler":
                    plan = sampler_plan(lengths, world, rank, args.seed, 0, setup["batch_size"])
                else:
                    plan = bucketing_plan(lengths, world, rank, args.seed, 0,
                                          setup["duration_budget"], setup["bounds"])
                steps = torch.tensor([len(plan)])
                dist.all_reduce(steps, op=dist.ReduceOp.MAX)
                plan += [[] for _ in range(int(steps) - len(plan))]
                dist.barrier()
                start = time.perf_counter()
                times = [step(b, speed) for b in plan]
                record(way, slow, 0, plan, times, start)
            elif way == "traincoord":
                traincoord_way(args, setup, rank, world, speed, slow, step, record, note)
            else:
                raise SystemExit(f"--ways: unknown way {way!r}")
    if rank == 0:
        Path(args.out).write_text(json.dumps(results))
    dist.destroy_process_group()


def traincoord_way(args, setup, rank, world, speed, slow, step, record, note):
    """The run `balance` (or `balance-slow`) of the coordinator the driver started, trained
    with Phases as docs/PYTHON.md shows ("Cost-balanced batches in step mode"): each batch
    "trains" (sleeps), the step's all-reduce follows, and the report carries the batch's own
    time. Records every train epoch; dev batches are reported at once. Rank 0 also takes the
    cost model the coordinator fitted from the reports of the first 5% of the first epoch's
    steps (the run's status, `cost_model`: docs/API.md), and the one it ends with."""
    import traincoord
    import traincoord.torch

    run = traincoord.Run(setup["url"], "balance-slow" if slow else "balance",
                         worker=f"rank{rank}", first_contact_timeout=30)
    phases = traincoord.torch.Phases(run, batch_size=None,
                                     sizes={"train": len(setup["lengths"]),
                                            "dev": len(setup["dev_lengths"])})
    try:
        for phase in phases:
            if phase.set != "train":
                for _ in phase:
                    phase.report(0.0)
                continue
            batches, times, held = [], [], {}
            # Rank 0, first epoch: the model after 5% of its steps (the first `early` steps).
            early = None
            if rank == 0 and phase.epoch == 0:
                early = max(1, round(0.05 * train_steps(run)))
            start = time.perf_counter()
            for batch in phase:
                bt, ar, end, t0, asked = step(batch, speed)
                batches.append(list(batch))
                times.append((bt, ar, end, t0, asked))
                phase.report(0.0, seconds=bt)
                if early is not None and len(batches) == early:
                    # Every rank's reports of the first `early` steps, and no more (a rank
                    # reports its next batch after that step's all-reduce, which waits on this
                    # one): once they reached the coordinator (the feed sends reports in
                    # groups, or after REPORT_DELAY_MAX_S).
                    polled = time.perf_counter()
                    model, deadline = None, time.monotonic() + 10
                    while time.monotonic() < deadline:
                        model = run.status().get("cost_model")
                        if model and model["reports"] >= early * world:
                            break
                        time.sleep(0.05)
                    note({"way": "traincoord-model", "slow": slow, "after_steps": early,
                          "model": model})
                    held[len(batches) - 1] = time.perf_counter() - polled
            record("traincoord", slow, phase.epoch, batches, times, start, held)
        if rank == 0:
            note({"way": "traincoord-model", "slow": slow, "after_steps": None,
                  "model": run.status().get("cost_model")})
    finally:
        run.close()


def train_steps(run):
    """The steps of the open train epoch (the run's status, `steps`)."""
    for s in (run.status().get("steps") or {}).get("sets", []):
        if s["set"] == "train" and not s["closed"]:
            return s["planned"]
    return 0


# ---- figures ---------------------------------------------------------------------------------

def figures(lengths, result, scale):
    ranks = result["ranks"]
    w = len(ranks)
    steps = len(ranks[0]["rows"])
    start = max(r["start"] for r in ranks)
    ends = [ranks[0]["rows"][k]["end"] for k in range(steps)]
    # (a step after one where a rank held up the group on the benchmark's own business, rank
    # 0's poll of the status in the first epoch, is counted without that hold)
    held = [0.0] + [max(r["rows"][k - 1].get("held_s", 0.0) for r in ranks)
                    for k in range(1, steps)]
    step_times = [ends[0] - ranks[0]["start"]] + [ends[k] - ends[k - 1] - held[k]
                                                  for k in range(1, steps)]
    net = []
    stragglers = []
    use = pad = 0.0
    visits = {}
    for k in range(steps):
        rows = [r["rows"][k] for r in ranks]
        net.append(step_times[k] - min(row["allreduce_s"] for row in rows))
        times = [row["batch_s"] for row in rows]
        if sum(times) > 0:
            stragglers.append(max(times) / (sum(times) / w))
        for row in rows:
            b = row["samples"]
            use += useful(lengths, b)
            if b:
                pad += padded(lengths, b) - A
            for i in b:
                visits[i] = visits.get(i, 0) + 1
    del start
    total = sum(step_times)
    # Where a step's time goes, per step (ms): the longest sleep asked for, what the slowest
    # rank's sleep took beyond that, and the training thread's time between one step's
    # all-reduce and the next batch's start (the loop: the sampler's next batch, the report)
    # on the rank where it was longest.
    asked = [max(r["rows"][k]["asked_s"] for r in ranks) for k in range(steps)]
    slept = [max(r["rows"][k]["batch_s"] for r in ranks) for k in range(steps)]
    loop = [max(r["rows"][k]["t0"] - r["rows"][k - 1]["end"] for r in ranks) - held[k]
            for k in range(1, steps)]
    return {
        "steps": steps,
        "epoch_s": total,
        "step_ms": 1000 * total / steps,
        "net_step_ms": 1000 * sum(net) / steps,
        "asked_ms": 1000 * sum(asked) / steps,
        "overshoot_ms": 1000 * (sum(slept) - sum(asked)) / steps,
        "loop_ms": 1000 * sum(loop) / max(1, len(loop)),
        "E": use * scale / (w * total),
        "E_net": use * scale / (w * sum(net)),
        "S": sum(stragglers) / len(stragglers),
        "P": 1 - use / pad,
        "missing": sum(1 for i in range(len(lengths)) if i not in visits),
        "repeated": sum(v - 1 for v in visits.values()),
    }


RUN_TOML = """
name = "{name}"
[data]
train_samples = {train}
dev_samples = {dev}
train_lengths = "train.txt"
dev_lengths = "dev.txt"
seed = {seed}
[schedule]
mode = "steps"
epochs = 2
batch_budget = {budget}
cost_a = {a}
cost_b = {b}
cost_c = {c}
[leases]
timeout = 60.0
"""


def serve(tmp, lengths, dev_lengths, args):
    """An in-memory coordinator with the runs `balance` and `balance-slow` (the same config:
    the true cost declared, the budget of the other ways). Returns (process, url)."""
    import re
    (tmp / "train.txt").write_text("".join(f"{x}\n" for x in lengths))
    (tmp / "dev.txt").write_text("".join(f"{x}\n" for x in dev_lengths))
    configs = []
    for name in ("balance", "balance-slow"):
        path = tmp / f"{name}.toml"
        path.write_text(RUN_TOML.format(name=name, train=len(lengths), dev=len(dev_lengths),
                                        seed=args.seed, budget=args.budget, a=A, b=B, c=C))
        configs += ["--config", str(path)]
    proc = subprocess.Popen([args.binary, "serve", "--in-memory", "--listen", "127.0.0.1:0",
                             *configs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            # (its later output is not read: keep the pipe from filling)
            import threading
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    proc.wait(timeout=10)
    raise SystemExit(f"{args.binary} serve did not start")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--budget", type=float, default=400.0)
    p.add_argument("--scale", type=float, default=1e-4, help="seconds per cost unit")
    p.add_argument("--ways", default="sampler,buckets,traincoord")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--binary", default=str(REPO / "build" / "traincoord"))
    p.add_argument("--rank-of", help=argparse.SUPPRESS)
    p.add_argument("--setup", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_of:
        return rank_main(args)

    lengths = synthetic_lengths(args.samples, args.seed)
    bounds = lhotse_boundaries(lengths, LHOTSE_BUCKETS)
    batch_size = fit_batch_size(lengths, args.ranks, args.seed, args.budget)
    duration_budget = fit_duration_budget(lengths, args.ranks, args.seed, args.budget, bounds)
    print(f"{args.samples} lengths (median {sorted(lengths)[len(lengths) // 2]:.1f} s, "
          f"{min(lengths):.1f}-{max(lengths):.1f} s), {args.ranks} ranks, cost "
          f"{A} + {B}·n·L + {C}·n·L², budget {args.budget:g} "
          f"({args.budget * args.scale * 1000:.0f} ms); DistributedSampler batches of "
          f"{batch_size}; buckets: padded duration <= {duration_budget:.1f}", flush=True)
    dev_lengths = synthetic_lengths(4 * args.ranks, args.seed + 1)
    with tempfile.TemporaryDirectory() as tmp:
        setup = Path(tmp) / "setup.json"
        server, url = None, None
        procs = []
        try:
            if "traincoord" in args.ways.split(","):
                server, url = serve(Path(tmp), lengths, dev_lengths, args)
            setup.write_text(json.dumps({"lengths": lengths, "dev_lengths": dev_lengths,
                                         "batch_size": batch_size, "url": url,
                                         "duration_budget": duration_budget, "bounds": bounds}))
            out = Path(tmp) / "out.json"
            port = free_port()
            for rank in range(args.ranks):
                env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(args.ranks),
                       "PYTHONPATH": str(REPO / "python")}
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--rank-of", "1", "--setup", str(setup),
                     "--out", str(out), "--ways", args.ways, "--scale", str(args.scale),
                     "--seed", str(args.seed), "--budget", str(args.budget)], env=env))
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.2)
            if any(p.poll() != 0 for p in procs):
                raise SystemExit("a rank failed or timed out")
            results = json.loads(out.read_text())
        finally:
            for p in procs + ([server] if server else []):
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
    report(lengths, results, args)


def model_error(lengths, model, result):
    """How far the fitted model's predicted batch times are from the true ones (the sleeps
    asked for: the true cost at each rank's true speed), over the batches of `result` (an
    epoch of every rank): (mean, worst) relative error."""
    errors, measured = [], []
    speeds = model["speeds"]
    for rank, r in enumerate(result["ranks"]):
        for row in r["rows"]:
            batch = row["samples"]
            if not batch:
                continue
            n, longest = len(batch), max(lengths[i] for i in batch)
            predicted = speeds[rank] * (model["a"] + n * (model["b"] * longest +
                                                          model["c"] * longest * longest))
            errors.append(abs(predicted / row["asked_s"] - 1))
            measured.append(abs(row["batch_s"] / row["asked_s"] - 1))
    # (and how far the batch times the ranks measured, which the model is fitted from, are from
    # the true ones: the sleeps' overshoot on this machine)
    return (sum(errors) / len(errors), max(errors), sum(measured) / len(measured),
            sorted(measured)[len(measured) // 2])


def report(lengths, results, args):
    by = {}
    models = [r for r in results if r["way"] == "traincoord-model"]
    for r in results:
        if r["way"] == "traincoord-model":
            continue
        by.setdefault((r["way"], r["slow"]), []).append(figures(lengths, r, args.scale))
    names = {"sampler": "DistributedSampler", "buckets": "unsynchronised buckets",
             "traincoord": "traincoord step mode"}
    base = by.get(("sampler", False), [None])[-1]
    buckets = by.get(("buckets", False), [None])[-1]
    print(f"\n{'way':<24} {'E':>6} {'E_net':>6} {'S':>6} {'P':>6} {'epoch s':>8} "
          f"{'vs DS':>6} {'vs buckets':>10} {'slow rank':>9} {'once':>5}")
    for way in args.ways.split(","):
        if (way, False) not in by:
            continue
        f = by[(way, False)][-1]  # traincoord: the last epoch (the model fitted)
        s = by[(way, True)][-1]
        once = "yes" if f["missing"] == 0 and f["repeated"] == 0 else \
            f"-{f['missing']}/+{f['repeated']}"
        print(f"{names[way]:<24} {f['E']:6.3f} {f['E_net']:6.3f} {f['S']:6.3f} {f['P']:6.1%} "
              f"{f['epoch_s']:8.2f} {f['epoch_s'] / base['epoch_s'] if base else 0:6.2f} "
              f"{f['epoch_s'] / buckets['epoch_s'] if buckets else 0:10.2f} "
              f"{s['epoch_s'] / f['epoch_s']:9.2f} {once:>5}")
    if ("traincoord", False) in by and len(by[("traincoord", False)]) > 1:
        # The first epoch: planned with the declared cost and every rank alike, re-planned
        # once the model has every rank's speed (the warm-up re-plan, docs/SEMANTICS.md).
        f, s = by[("traincoord", False)][0], by[("traincoord", True)][0]
        once = "yes" if f["missing"] == 0 and f["repeated"] == 0 else \
            f"-{f['missing']}/+{f['repeated']}"
        print(f"{'  its first epoch':<24} {f['E']:6.3f} {f['E_net']:6.3f} {f['S']:6.3f} "
              f"{f['P']:6.1%} {f['epoch_s']:8.2f} "
              f"{f['epoch_s'] / base['epoch_s'] if base else 0:6.2f} "
              f"{f['epoch_s'] / buckets['epoch_s'] if buckets else 0:10.2f} "
              f"{s['epoch_s'] / f['epoch_s']:9.2f} {once:>5}")
    print("targets (traincoord):     E_net >= 0.95, S <= 1.03, P <= 2%, <= 0.2x DS, "
          "<= 0.9x buckets, slow rank <= 1.10x, exactly once")
    print("\nper step (ms), as is: step = net + all-reduce; net ~ the longest batch's sleep asked "
          "+ its overshoot + the loop between steps")
    print(f"{'way':<24} {'step':>7} {'net':>7} {'asked':>7} {'over':>7} {'loop':>7}")
    for way in args.ways.split(","):
        if (way, False) in by:
            f = by[(way, False)][-1]
            print(f"{names[way]:<24} {f['step_ms']:7.2f} {f['net_step_ms']:7.2f} "
                  f"{f['asked_ms']:7.2f} {f['overshoot_ms']:7.2f} {f['loop_ms']:7.2f}")
    # The fitted cost model against the true one (target: within 10% after 5% of the first
    # epoch), over every batch of the first epoch, each rank at its fitted speed.
    raw = [r for r in results if r["way"] == "traincoord"]
    for m in models:
        epoch0 = next((r for r in raw if r["slow"] == m["slow"] and r["epoch"] == 0), None)
        model = m["model"]
        if epoch0 is None or not model or not model.get("fitted"):
            print(f"cost model{' (rank slowed)' if m['slow'] else ''}: not fitted "
                  f"({model and model.get('reports')} reports)")
            continue
        mean, worst, measured, measured_median = model_error(lengths, model, epoch0)
        when = (f"after {m['after_steps']} steps of the first epoch" if m["after_steps"]
                else "at the end")
        true = [2.0 if m["slow"] and r == args.ranks - 1 else 1.0 for r in range(args.ranks)]
        print(f"cost model{' (rank ' + str(args.ranks - 1) + ' slowed 2x)' if m['slow'] else ''} "
              f"{when} ({model['reports']} reports): {model['model']} s at speed 1 "
              f"(true {A * args.scale:g} + {B * args.scale:g} + {C * args.scale:g}); first "
              f"epoch's batch times within {mean:.1%} on average, {worst:.1%} at worst "
              f"(target 10%); speeds {' '.join(f'{v:.2f}' for v in model['speeds'])} "
              f"(true {' '.join(f'{v:g}' for v in true)}); the measured batch times were "
              f"{measured:.1%} from the true on average ({measured_median:.1%} the median)")
    print(json.dumps({f"{w}{'_slow' if s else ''}": v for (w, s), v in by.items()}))
    # The promise holds in every run of traincoord's way (each sample once per epoch); the
    # baselines' repeats are DistributedSampler's padding, counted, not an error.
    broken = [f"{w}{' slowed' if s else ''} epoch {e}: {f['missing']} samples missing, "
              f"{f['repeated']} repeated" for (w, s), fs in by.items() if w == "traincoord"
              for e, f in enumerate(fs) if f["missing"] or f["repeated"]]
    if broken:
        raise SystemExit("traincoord did not train each sample once: " + "; ".join(broken))


if __name__ == "__main__":
    main()
