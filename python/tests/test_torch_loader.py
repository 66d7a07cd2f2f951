"""traincoord.torch under real DataLoaders (issue: jobs completed only once trained).

Two ranks train through real ``torch.utils.data.DataLoader``s over a grid of loader settings,
and faults (an early break, an exception, a rank killed with SIGKILL while its loader has
prefetched). After each run the coordinator's record must show every sample of every epoch
trained exactly once: each epoch's sample count equals the set's size, and its loss (each
batch's loss is the mean of its sample ids) equals the mean id of the set, (n - 1) / 2."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import traincoord

HERE = Path(__file__).resolve().parent
TRAIN, DEV, BATCH = 200, 50, 8  # 25 train batches, 7 dev batches (the last one of 2 samples)

LOADER_TOML = f"""
name = "loader"
[data]
train_samples = {TRAIN}
dev_samples = {DEV}
batch_size = {BATCH}
seed = 11
[schedule]
epochs = 3
iters_per_worker = 2
validation_every = 1
[leases]
timeout = 2.0
"""


@pytest.fixture
def loader_server(serve_toml):
    return serve_toml(LOADER_TOML)


def start_rank(server, tmp_path, name, *args, env=None):
    log = tmp_path / f"{name}.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "torch_worker.py"), "--url", server.url, "--name", name,
         "--log", str(log), "--train", str(TRAIN), "--dev", str(DEV),
         "--batch-size", str(BATCH), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return proc, log


def started(rank, timeout=120):
    """Waits until a rank has entered its first phase (or ended): a rank whose fault is to come
    mid-epoch must not start so late that the others trained every epoch already."""
    proc, log = rank
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any("phase" in r for r in read_log(log)):
            return rank
        time.sleep(0.05)
    return rank


def finish(procs, timeout=180):
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for proc, _ in procs:
            out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
            outputs.append(out)
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def read_log(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_exactly_once(server):
    run = traincoord.Run(server.url, "loader", "checker", heartbeats=False)
    status = run.status()
    run.close()
    assert status["state"] == "completed", status["reason"]
    epochs = status["epochs"]
    assert [(e["set"], e["epoch"]) for e in epochs] == [
        (s, e) for e in range(3) for s in ("train", "dev")]
    for e in epochs:
        n = TRAIN if e["set"] == "train" else DEV
        assert e["closed"] and e["done"] == e["jobs"]
        assert e["samples"] == n, e
        assert e["loss"] == pytest.approx((n - 1) / 2, rel=1e-12), e
        assert e["metrics"]["even"] == pytest.approx(((n + 1) // 2) / n, rel=1e-12), e
    return status


def trained_ids(log):
    """The sample ids a rank reported, per (set, epoch)."""
    out = {}
    for r in read_log(log):
        if "ids" in r:
            out.setdefault((r["set"], r["epoch"]), []).extend(r["ids"])
    return out


LOADERS = [
    pytest.param([], id="workers0"),
    pytest.param(["--num-workers", "2", "--prefetch", "2"], id="workers2-prefetch2"),
    pytest.param(["--num-workers", "2", "--prefetch", "8", "--persistent"],
                 id="workers2-prefetch8-persistent"),
    pytest.param(["--num-workers", "4", "--prefetch", "2", "--persistent", "--pin-memory"],
                 id="workers4-prefetch2-persistent-pin"),
    pytest.param(["--num-workers", "4", "--prefetch", "8"], id="workers4-prefetch8"),
]


@pytest.mark.parametrize("loader", LOADERS)
def test_every_sample_of_every_epoch_is_trained_exactly_once(loader_server, tmp_path, loader):
    ranks = [start_rank(loader_server, tmp_path, f"r{i}", *loader) for i in range(2)]
    outputs = finish(ranks)
    for (proc, _), out in zip(ranks, outputs):
        assert proc.returncode == 0, out
    check_exactly_once(loader_server)
    # The ranks' own logs agree: each sample once per epoch, and a fresh permutation each epoch.
    seen = {}
    for _, log in ranks:
        for key, ids in trained_ids(log).items():
            seen.setdefault(key, []).extend(ids)
    for (s, _), ids in seen.items():
        assert sorted(ids) == list(range(TRAIN if s == "train" else DEV))
    # on_epoch_end: once per epoch, in order, after the epoch closed; a rank whose Phases
    # started after some epochs had closed is told of the later ones only.
    every = [[s, e, True] for e in range(3) for s in ("train", "dev")]
    ends = [[r["ends"] for r in read_log(log) if "ends" in r][0] for _, log in ranks]
    for told in ends:
        assert told == every[len(every) - len(told):]
    assert every in ends  # the first rank to start saw them all


def test_batches_left_in_the_loader_by_a_break_go_back_and_are_trained_once(
        loader_server, tmp_path):
    quitter = started(start_rank(loader_server, tmp_path, "quitter", "--num-workers", "2",
                                 "--prefetch", "4", "--break-at", "train:0:3", "--step-ms", "20"))
    other = start_rank(loader_server, tmp_path, "other", "--num-workers", "2")
    outputs = finish([quitter, other])
    assert quitter[0].returncode == 0 and other[0].returncode == 0, outputs
    status = check_exactly_once(loader_server)
    assert status["counters"]["failure_reports"] == 0  # handed back, not failed


def test_an_exception_mid_epoch_hands_the_loaders_batches_back(loader_server, tmp_path):
    crashing = started(start_rank(loader_server, tmp_path, "crashing", "--num-workers", "2",
                                  "--prefetch", "4", "--raise-at", "train:1:2", "--step-ms", "20"))
    other = start_rank(loader_server, tmp_path, "other", "--num-workers", "2")
    outputs = finish([crashing, other])
    assert crashing[0].returncode != 0 and "injected error" in outputs[0]
    assert other[0].returncode == 0, outputs[1]
    status = check_exactly_once(loader_server)
    assert status["counters"]["lease_expiries"] == 0  # given back at exit, not left to expire


def test_a_rank_killed_with_its_loader_prefetched_loses_nothing(loader_server, tmp_path):
    victim = started(start_rank(loader_server, tmp_path, "victim", "--num-workers", "2",
                                "--prefetch", "8", "--die-at", "train:1:3", "--step-ms", "20"))
    other = start_rank(loader_server, tmp_path, "other", "--num-workers", "2")
    outputs = finish([victim, other])
    assert victim[0].returncode == -9
    assert other[0].returncode == 0, outputs[1]
    check_exactly_once(loader_server)


def test_ddp_ranks_stay_in_step_when_one_gets_no_job_of_an_epoch(loader_server, tmp_path):
    # 32 batches (16 jobs) ahead and 13 train jobs an epoch: one rank may take a whole epoch. The other
    # still gets that epoch as an (empty) phase, so both enter the same join() contexts and
    # DDP's all-reduces match; nothing hangs.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        ranks.append(start_rank(loader_server, tmp_path, f"ddp{rank}", "--ddp", "--batches-ahead",
                                "32", "--num-workers", "2", env=env))
    outputs = finish(ranks)
    for (proc, _), out in zip(ranks, outputs):
        assert proc.returncode == 0, out
    check_exactly_once(loader_server)
    phases = [[tuple(r["phase"]) for r in read_log(log) if "phase" in r] for _, log in ranks]
    assert phases[0] == phases[1] == [(s, e) for e in range(3) for s in ("train", "dev")]
