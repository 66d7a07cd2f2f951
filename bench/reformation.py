#!/usr/bin/python3
"""Re-formation time of `traincoord launch` (docs/PERFORMANCE.md, "Re-formation after a failure"):
two agents on loopback ("nodes" a and b, one rank each, --nnodes 1:2) train a run with a tiny
PyTorch rank (DDP process group over gloo, a linear model, 50 ms per job); then a fault:

  rank   SIGKILL of node b's rank: both agents stop their group and re-form with both nodes;
  agent  SIGKILL of node b's agent (its rank dies with it): node a re-forms alone.

Each phase is timed from the kill, on one clock (time.time(): the agents' lines stamped as they
arrive, the ranks' own stamps):

  detected   the first line of an agent after the kill (the group stops, or a rank exited)
  formed     the agents said the new round (the last "is node rank" line): ranks are spawned
  python     the last new rank's Python runs its first line
  torch      ... has imported torch
  ddp        every new rank joined its DDP process group
  trained    the first job of the new group completed (the coordinator answered it)

    /usr/bin/python3 bench/reformation.py --binary build/traincoord --reps 3

Bounded: each repetition starts its own coordinator and agents, waits at most --limit seconds
for each step, and kills what it started (by pid) whatever happens.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RUN = """
name = "reform"
[data]
train_batches = 1000000
[schedule]
epochs = 1
[leases]
timeout = 2
max_attempts = 100
"""

RANK = """
import os, sys, time
print(f"@{{time.time():.3f}} start", flush=True)
open("rank.pid", "w").write(str(os.getpid()))
import torch
import torch.distributed as dist
print(f"@{{time.time():.3f}} torch", flush=True)
dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the agent
print(f"@{{time.time():.3f}} ddp", flush=True)
sys.path.insert(0, {python!r})
import traincoord
run = traincoord.Run.from_env()
model = torch.nn.Linear(8, 2)
first = True
for job in run.jobs():
    loss = model(torch.randn(32, 8)).pow(2).mean()
    loss.backward()
    time.sleep(0.05)
    job.complete(loss=float(loss), samples=32)
    if first:
        print(f"@{{time.time():.3f}} trained", flush=True)
        first = False
"""


class Process:
    """A child process whose output lines are kept with the time each arrived."""

    def __init__(self, argv, cwd):
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines = []  # (arrival time, line)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append((time.time(), line.rstrip("\n")))

    def since(self, t):
        with self.lock:
            return [(at, line) for at, line in self.lines if at >= t]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def wait_for(what, predicate, limit):
    deadline = time.time() + limit
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(f"no {what} within {limit} s")


def stamps(agent, word, t):
    """The ranks' own stamps of `word` after `t` (lines "[rankN] @T word", prefixed or not)."""
    out = []
    for _, line in agent.since(t):
        m = re.search(r"@(\d+\.\d+) " + word + r"\b", line)
        if m and float(m.group(1)) >= t:
            out.append(float(m.group(1)))
    return out


def agent_lines(agent, t, text):
    return [at for at, line in agent.since(t) if "traincoord launch:" in line and text in line]


def one(args, fault, work):
    run_toml = work / "run.toml"
    run_toml.write_text(RUN)
    (work / "rank.py").write_text(RANK.format(python=str(REPO / "python")))
    started = []
    try:
        server = Process([args.binary, "serve", "--config", str(run_toml), "--in-memory",
                          "--listen", "127.0.0.1:0"], cwd=work)
        started.append(server)
        said = wait_for("listening line", lambda: [
            m for _, line in server.since(0)
            for m in [re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)] if m], 20)
        url = said[0].group(1)
        agents = {}
        for node in ("a", "b"):
            (work / node).mkdir()
            agents[node] = Process(
                [args.binary, "launch", "--url", url, "--run", "reform", "--nnodes", "1:2",
                 "--nproc-per-node", "1", "--node", node, "--settle", str(args.settle),
                 "--node-timeout", str(args.node_timeout), "--grace", "2",
                 "--max-restarts", "5", "--", "/usr/bin/python3", str(work / "rank.py")],
                cwd=work / node)
            started.append(agents[node])
        t_start = time.time()
        for a in agents.values():
            wait_for("first job of the first group", lambda a=a: stamps(a, "trained", t_start),
                     args.limit)
        time.sleep(1.0)
        t = time.time()
        if fault == "rank":
            os.kill(int((work / "b" / "rank.pid").read_text()), signal.SIGKILL)
        else:
            agents["b"].proc.kill()
        survivors = list(agents.values()) if fault == "rank" else [agents["a"]]
        detected = wait_for("detection", lambda: [
            at for a in survivors for at, line in a.since(t) if "traincoord launch:" in line],
            args.limit)
        formed = [wait_for("round formed", lambda a=a: agent_lines(a, t, "is node rank"),
                           args.limit)[0] for a in survivors]
        ranks = {word: [wait_for(word, lambda a=a: stamps(a, word, t), args.limit)[0]
                        for a in survivors] for word in ("start", "torch", "ddp")}
        trained = [wait_for("trained", lambda a=a: stamps(a, "trained", t), args.limit)[0]
                   for a in survivors]
        return {"detected": min(detected) - t, "formed": max(formed) - t,
                "python": max(ranks["start"]) - t, "torch": max(ranks["torch"]) - t,
                "ddp": max(ranks["ddp"]) - t, "trained": min(trained) - t}
    finally:
        for p in reversed(started):
            p.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default=str(REPO / "build" / "traincoord"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--faults", default="rank,agent")
    parser.add_argument("--node-timeout", type=float, default=5)
    parser.add_argument("--settle", type=float, default=2)
    parser.add_argument("--limit", type=float, default=60, help="seconds to wait for each step")
    args = parser.parse_args()
    phases = ("detected", "formed", "python", "torch", "ddp", "trained")
    print(f"--node-timeout {args.node_timeout:g} --settle {args.settle:g}, "
          f"{args.reps} repetitions; seconds after the kill")
    print(f"{'fault':6} " + " ".join(f"{p:>9}" for p in phases))
    for fault in args.faults.split(","):
        results = []
        for _ in range(args.reps):
            with tempfile.TemporaryDirectory() as d:
                r = one(args, fault, Path(d))
            results.append(r)
            print(f"{fault:6} " + " ".join(f"{r[p]:9.2f}" for p in phases), flush=True)
        print(f"{fault:6} " + " ".join(
            f"{statistics.median(r[p] for r in results):9.2f}" for p in phases) + "  (median)",
            flush=True)


if __name__ == "__main__":
    sys.exit(main())
