"""A rank of a test run: trains a data set of sample ids through real DataLoaders fed by
traincoord.torch.Phases, and logs every batch it reports (test_torch_loader.py).

The "loss" of a batch is the mean of its sample ids, its metric `even` the share of even ids:
a run that trains every sample of an epoch exactly once has epoch loss (n - 1) / 2 whatever the
split into jobs, workers and batches."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import traincoord  # noqa: E402
import traincoord.torch  # noqa: E402


class Ids(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.tensor(i)


def where(spec):
    """'train:1:3' -> ("train", 1, 3): act after the 3rd batch of the first train phase of epoch
    1 or later in which this rank gets 3 batches (a rank that starts late, when the others
    already trained epoch 1, still acts), once."""
    if not spec:
        return None
    s, e, k = spec.split(":")
    return s, int(e), int(k)


class Trigger:
    def __init__(self, spec):
        self.point = where(spec)

    def __call__(self, here):
        if self.point is None:
            return False
        (s, e, k), (hs, he, hk) = self.point, here
        if hs == s and he >= e and hk == k:
            self.point = None  # once
            return True
        return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--train", type=int, default=200)
    p.add_argument("--dev", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--prefetch", type=int, default=0, help="prefetch_factor (0: default)")
    p.add_argument("--persistent", action="store_true",
                   help="persistent_workers, with one DataLoader per set kept across phases")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--shuffle", default="epoch")
    p.add_argument("--break-at", default="", help="SET:EPOCH:K: break after K batches")
    p.add_argument("--raise-at", default="", help="SET:EPOCH:K: raise after K batches")
    p.add_argument("--die-at", default="", help="SET:EPOCH:K: SIGKILL itself after K batches")
    p.add_argument("--step-ms", type=float, default=2.0)
    p.add_argument("--batches-ahead", type=int, default=4, help="Phases(prefetch=...)")
    p.add_argument("--ddp", action="store_true",
                   help="train a model with DistributedDataParallel (gloo) and join()")
    a = p.parse_args()
    torch.set_num_threads(1)

    model = step = None
    if a.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)

        def step(ids):
            optimizer.zero_grad()
            model(ids.float().unsqueeze(1)).mean().backward()  # an all-reduce per batch
            optimizer.step()
    log = open(a.log, "w")
    run = traincoord.Run(a.url, "loader", a.name, long_poll=5, first_contact_timeout=20)
    ends = []
    phases = traincoord.torch.Phases(
        run, batch_size=a.batch_size, sizes={"train": a.train, "dev": a.dev}, shuffle=a.shuffle,
        on_epoch_end=lambda s, e, record: ends.append([s, e, record["closed"]]),
        prefetch=a.batches_ahead)
    data = {"train": Ids(a.train), "dev": Ids(a.dev)}
    options = {"num_workers": a.num_workers, "pin_memory": a.pin_memory}
    if a.num_workers and a.prefetch:
        options["prefetch_factor"] = a.prefetch
    if a.num_workers and a.persistent:
        options["persistent_workers"] = True
    kept = {s: DataLoader(data[s], batch_sampler=phases.sampler(s), **options)
            for s in ("train", "dev")} if a.persistent else {}
    stop_at, raise_at, die_at = Trigger(a.break_at), Trigger(a.raise_at), Trigger(a.die_at)

    for phase in phases:
        log.write(json.dumps({"phase": [phase.set, phase.epoch], "revisit": phase.revisit}) + "\n")
        log.flush()
        loader = kept[phase.set] if kept else DataLoader(data[phase.set], batch_sampler=phase,
                                                         **options)
        k = 0
        training = model is not None and phase.set == "train"
        join = model.join(divide_by_initial_world_size=False) if training else None
        if join is not None:
            join.__enter__()
        for ids in loader:
            time.sleep(a.step_ms / 1000)
            if training:
                step(ids)
            ids = ids.tolist()
            phase.report(sum(ids) / len(ids), even=sum(1 for i in ids if i % 2 == 0) / len(ids))
            k += 1
            log.write(json.dumps({"set": phase.set, "epoch": phase.epoch, "ids": ids}) + "\n")
            log.flush()
            here = (phase.set, phase.epoch, k)
            if die_at(here):
                os.kill(os.getpid(), signal.SIGKILL)
            if raise_at(here):
                raise RuntimeError("the training step failed (a test's injected error)")
            if stop_at(here):
                break
        if join is not None:
            join.__exit__(None, None, None)
    log.write(json.dumps({"finished": run.finished.state, "ends": ends}) + "\n")
    log.close()
    run.close()


if __name__ == "__main__":
    main()
