"""What traincoord.torch costs a PyTorch loop next to torch's DistributedSampler, in one run.

The digits model of examples/digits (an MLP, batches of 32, train + dev every epoch) is trained
for E epochs on N ranks (DDP over gloo when N > 1), three ways, alternating, R rounds each:

  1. DistributedSampler (shuffled every epoch with set_epoch);
  2. traincoord, 1 batch per job;
  3. traincoord, 8 batches per job;
  4. traincoord in step mode (schedule.mode = "steps": one batch per rank per step, no join(),
     the loss scaled by phase.loss_scale);

the traincoord ways with a real coordinator (`traincoord serve --in-memory` on loopback),
per-epoch sample shuffling and the default prefetch. An epoch's time is the slowest rank's.
Prints the best of R per way, per epoch, and its ratio to (1). --step-ms S adds S ms of sleep
after each optimizer step: the time a GPU step takes off the CPU, as the host sees it.

    /usr/bin/python3 bench/sampler_overhead.py [--ranks 1] [--epochs 10] [--rounds 3]
        [--prefetch 4] [--step-ms 0]
"""

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "examples" / "digits"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(args):
    """One rank of one way: trains, prints {"elapsed": seconds} as its last line."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import traincoord
    import traincoord.torch
    from train import DEV, TRAIN, datasets

    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    train_set, dev_set = datasets()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def train_step(x, y, scale=1.0):
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        (loss * scale).backward() if scale != 1.0 else loss.backward()
        optimizer.step()
        if args.step_ms > 0:
            time.sleep(args.step_ms / 1000)
        return loss

    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    if args.way == "sampler":
        rank = int(os.environ["RANK"])
        train_sampler = torch.utils.data.DistributedSampler(train_set, world, rank, seed=1)
        dev_sampler = torch.utils.data.DistributedSampler(dev_set, world, rank, shuffle=False)
        train = torch.utils.data.DataLoader(train_set, batch_size=32, sampler=train_sampler)
        dev = torch.utils.data.DataLoader(dev_set, batch_size=32, sampler=dev_sampler)
        for epoch in range(args.epochs):
            train_sampler.set_epoch(epoch)
            for x, y, *_ in train:
                train_step(x, y)
            with torch.no_grad():
                for x, y, *_ in dev:
                    loss_fn(model(x), y)
    else:
        run = traincoord.Run(args.url, args.run, f"rank{os.environ['RANK']}")
        phases = traincoord.torch.Phases(run, batch_size=32, sizes={"train": TRAIN, "dev": DEV},
                                         prefetch=args.prefetch)
        for phase in phases:
            if phase.set == "train" and args.way == "steps":  # every rank: the same steps
                for x, y, *_ in torch.utils.data.DataLoader(train_set, batch_sampler=phase):
                    phase.report(train_step(x, y, phase.loss_scale).item())
            elif phase.set == "train":
                join = (ddp.join(divide_by_initial_world_size=False) if world > 1
                        else contextlib.nullcontext())
                with join:
                    for x, y, *_ in torch.utils.data.DataLoader(train_set, batch_sampler=phase):
                        phase.report(train_step(x, y).item())
            else:
                with torch.no_grad():
                    for x, y, *_ in torch.utils.data.DataLoader(dev_set, batch_sampler=phase):
                        phase.report(loss_fn(model(x), y).item())
        run.close()
    elapsed = time.perf_counter() - start
    if world > 1:
        dist.destroy_process_group()
    print(json.dumps({"elapsed": elapsed}), flush=True)


def run_way(args, way, url="", run=""):
    """Starts the ranks of one way; returns the slowest rank's time."""
    port = free_port()
    procs = []
    for rank in range(args.ranks):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--rank-of", way, "--url", url, "--run", run,
             "--epochs", str(args.epochs), "--prefetch", str(args.prefetch),
             "--step-ms", str(args.step_ms)],
            env=env, stdout=subprocess.PIPE, text=True))
    times = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"a rank of {way} failed (exit {p.returncode})")
            times.append(json.loads(out.strip().splitlines()[-1])["elapsed"])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return max(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--traincoord", default=str(REPO / "build" / "traincoord"))
    parser.add_argument("--rank-of", dest="way", default="", help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--run", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        return rank_main(args)

    from train import DEV, TRAIN
    ways = {"sampler": ("DistributedSampler", 0), "tc1": ("traincoord, 1 batch/job", 1),
            "tc8": ("traincoord, 8 batches/job", 8), "steps": ("traincoord, step mode", 1)}
    times = {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as tmp:
        configs = []
        for r in range(args.rounds):
            for way, (_, per_job) in ways.items():
                if not per_job:
                    continue
                path = Path(tmp) / f"{way}-{r}.toml"
                path.write_text(f'name = "{way}-{r}"\n[data]\ntrain_samples = {TRAIN}\n'
                                f'dev_samples = {DEV}\nbatch_size = 32\nseed = 1\n'
                                f'[schedule]\nepochs = {args.epochs}\n'
                                f'iters_per_worker = {per_job}\n' +
                                ('mode = "steps"\n' if way == "steps" else ''))
                configs += ["--config", str(path)]
        server = subprocess.Popen([args.traincoord, "serve", *configs, "--in-memory", "--listen",
                                   "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
        try:
            for line in server.stdout:
                m = re.search(r"listening on (http://\S+)", line)
                if m:
                    url = m.group(1)
                    break
            for r in range(args.rounds):
                for way in ways:
                    times[way].append(run_way(args, way, url, f"{way}-{r}"))
        finally:
            server.kill()
            server.wait()
    base = min(times["sampler"]) / args.epochs
    print(f"digits, {args.epochs} epochs (train + dev), batch 32, {args.ranks} rank(s), prefetch "
          f"{args.prefetch}, {args.step_ms:g} ms off-CPU per step; best of {args.rounds}, per "
          f"epoch:")
    for way, (label, _) in ways.items():
        per_epoch = min(times[way]) / args.epochs
        print(f"  {label:28s} {per_epoch * 1000:8.1f} ms   {per_epoch / base:5.2f}x")


if __name__ == "__main__":
    main()
