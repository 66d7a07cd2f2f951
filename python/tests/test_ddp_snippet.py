"""The job-mode DDP loop of docs/PYTHON.md ("DDP in job mode: train inside join()"), run as printed on 2 ranks (gloo,
real DataLoaders with 2 loader workers): it finishes every epoch without hanging, and every
sample of every epoch was trained once. The same loop without join() hangs (checked too: a new
user copying a snippet without it is the failure this section exists for)."""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# 13 train batches of 32 (404 samples) for 2 ranks: the shares differ in most epochs.
DDP_TOML = """
name = "ddp"
[data]
train_samples = 404
dev_samples = 70
batch_size = 32
seed = 11
[schedule]
mode = "jobs"               # (by default this run would hand the group steps)
epochs = 3
iters_per_worker = 1
validation_every = 1
[leases]
timeout = 5.0
"""

RUN_LINE = "run = traincoord.Run.from_env(long_poll=5, first_contact_timeout=20)\n"

# What the snippet needs defined before it, and what the test reads after it.
PRELUDE = """
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
import traincoord, traincoord.torch

class Ids(Dataset):
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __getitem__(self, i):
        if not 0 <= i < self.n: raise IndexError(i)
        return torch.tensor([float(i)]), torch.tensor([0.0])

class Recording(torch.nn.Module):  # a linear model that notes the samples it trains on
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.seen = []
    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            self.seen.extend(int(v) for v in x[:, 0].tolist())
        time.sleep(0.002 * (1 + dist.get_rank()))  # rank 1 is slower: the shares differ
        return self.lin(x)

torch.set_num_threads(1)
dist.init_process_group("gloo")
run = traincoord.Run.from_env(long_poll=5, first_contact_timeout=20)
train_set, dev_set = Ids(404), Ids(70)
net = Recording()
model = torch.nn.parallel.DistributedDataParallel(net)
optim = torch.optim.SGD(model.parameters(), lr=1e-4)
loss_fn = torch.nn.MSELoss()
"""

EPILOGUE = """
with open(os.environ["SEEN_FILE"], "w") as f:
    json.dump(net.seen, f)
run.close()
"""


def snippet(doc, heading):
    """The first ```python block after `heading` in docs/DOC."""
    text = (REPO / "docs" / doc).read_text()
    after = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(server, code, tmp_path, timeout, until=None, ranks=2, run="ddp"):
    """Starts `ranks` ranks of `code` for run `run`; returns (finished, outputs, seen per rank)
    once they ended, or `until()` returned the same value (not None) for 3 s, or `timeout`
    passed. Stops them by PID."""
    script = tmp_path / "train.py"
    script.write_text(code)
    port = free_port()
    procs, logs = [], []
    try:
        for rank in range(ranks):
            env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "TRAINCOORD_URL": server.url,
                   "TRAINCOORD_RUN": run, "TRAINCOORD_WORKER": f"rank{rank}",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                   "WORLD_SIZE": str(ranks), "SEEN_FILE": str(tmp_path / f"seen{rank}.json")}
            logs.append(open(tmp_path / f"rank{rank}.log", "w+"))
            procs.append(subprocess.Popen([sys.executable, str(script)], env=env,
                                          stdout=logs[-1], stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        held, held_since = None, None
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.2)
            now = until() if until is not None else None
            if now is None or now != held:
                held, held_since = now, time.monotonic()
            elif time.monotonic() - held_since > 3:
                break
        finished = all(p.poll() == 0 for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    seen = []
    for rank in range(ranks):
        path = tmp_path / f"seen{rank}.json"
        seen.append(json.loads(path.read_text()) if path.exists() else None)
    return finished, outputs, seen


def test_the_ddp_loop_of_the_docs_trains_every_sample_once_without_hanging(serve_toml, tmp_path):
    code = snippet("PYTHON.md", "### DDP in job mode")
    assert "model.join(" in code
    server = serve_toml(DDP_TOML)
    finished, outputs, seen = run_ranks(server, PRELUDE + code + EPILOGUE, tmp_path, timeout=120)
    assert finished, "\n---\n".join(outputs)
    trained = sorted(seen[0] + seen[1])
    assert trained == sorted(list(range(404)) * 3), (len(seen[0]), len(seen[1]))
    assert seen[0] and seen[1]  # both ranks trained
    with urllib.request.urlopen(f"{server.url}/v1/runs/ddp", timeout=20) as reply:
        status = json.load(reply)
    assert status["state"] == "completed", status["state"]
    assert status["mode"] == "jobs"
    # Phases warned each rank that a group in job mode needs join().
    assert all('schedule.mode = "jobs"' in out and "join(" in out for out in outputs), outputs


def test_without_join_the_same_loop_hangs(serve_toml, tmp_path):
    """The reason for the section: the loop without join() never ends when the shares differ."""
    code = snippet("PYTHON.md", "### DDP in job mode")
    bare = code.replace("with model.join(divide_by_initial_world_size=False):", "if True:")
    assert bare != code
    server = serve_toml(DDP_TOML)
    finished, outputs, seen = run_ranks(server, PRELUDE + bare + EPILOGUE, tmp_path, timeout=150,
                                        until=lambda: first_epoch_unfinished(server) or None)
    assert not finished, "\n---\n".join(outputs)
    # The first epoch stopped moving short of its 13 jobs: the rank with the longer share waits
    # in an all-reduce that never comes, holding its last jobs (one more than the other rank's
    # share, or more when its loader had fetched ahead).
    done = first_epoch_unfinished(server)
    assert done is not None and 1 <= done < 13, done


def first_epoch_unfinished(server):
    """The first train epoch's jobs done while the run goes on and that epoch is open; None
    once it closed (or before it opened)."""
    with urllib.request.urlopen(f"{server.url}/v1/runs/ddp", timeout=20) as reply:
        status = json.load(reply)
    first = [e for e in status["epochs"] if e["set"] == "train" and e["epoch"] == 0]
    if status["state"] != "running" or not first or first[0]["closed"]:
        return None
    return first[0]["done"]
