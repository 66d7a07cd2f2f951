"""A rank of the visit-counting model (test_cuts.py): one incarnation of a DDP group restarted
from its latest checkpoint, with the data state_dict of traincoord.torch.Phases.

The "model" is a tensor of counts, one per (epoch, train batch): a rank adds 1 for every
train batch it trains, then reports it. Every rank steps in lockstep (one all-reduce per step,
also on ranks whose loader ran dry, as DDP's join() does), so all of them checkpoint at the
same step: each calls phases.state_dict(), the counts of the ranks are summed into the model,
rank 0 saves {"model", "data"} atomically, and a barrier ends the checkpoint (as
torch.distributed.checkpoint.save does). A batch's loss is a function of (set, epoch, batch),
so the epoch losses the coordinator computes can be checked exactly.

The environment names the rank (RANK, WORLD_SIZE, TRAINCOORD_GROUP); --kill names where one
rank of the group SIGKILLs itself (the driver then kills the rest of the group, as a launcher
does)."""

import argparse
import datetime
import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import traincoord  # noqa: E402
import traincoord.torch  # noqa: E402


def batch_loss(set_name, epoch, batch):
    return (100.0 if set_name == "dev" else 0.0) + epoch + 0.001 * batch


class Ids(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.tensor(i)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--dir", required=True, help="checkpoints, the final model, logs")
    p.add_argument("--store", required=True, help="torch.distributed file store of this start")
    p.add_argument("--train", type=int, required=True)
    p.add_argument("--dev", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--checkpoints", required=True, help="steps to checkpoint at: 3,9,14")
    p.add_argument("--kill", default="", help="RANK:WHERE:N, WHERE one of step (after training "
                   "its first batch at step N or later), cut (right after the N-th state_dict "
                   "returned), save (right after the N-th checkpoint was written), restore "
                   "(right after load_state_dict or start_fresh)")
    a = p.parse_args()
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    group = os.environ["TRAINCOORD_GROUP"]
    out = Path(a.dir)
    log = open(out / f"{group}-r{rank}.jsonl", "w")

    def note(**record):
        log.write(json.dumps(record) + "\n")
        log.flush()

    kill_rank, kill_where, kill_n = None, None, None
    if a.kill:
        r, kill_where, n = a.kill.split(":")
        kill_rank, kill_n = int(r), int(n)

    def maybe_die(where, n=0):
        # "step": after the first batch this rank trains at step N or later.
        if rank == kill_rank and where == kill_where and (n >= kill_n if where == "step"
                                                          else n == kill_n):
            note(killed=where, n=n)
            os.kill(os.getpid(), signal.SIGKILL)

    dist.init_process_group("gloo", init_method=f"file://{a.store}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    run = traincoord.Run(a.url, a.run, f"{group}-r{rank}", long_poll=2, first_contact_timeout=20)
    phases = traincoord.torch.Phases(run, batch_size=a.batch_size,
                                     sizes={"train": a.train, "dev": a.dev}, shuffle="none")
    assert run.group == group, (run.group, group)
    train_batches = -(-a.train // a.batch_size)
    path = out / "checkpoint.pt"
    if path.exists():
        checkpoint = torch.load(path)
        model = checkpoint["model"]
        phases.load_state_dict(checkpoint["data"])
        note(restored=checkpoint["data"]["cut"])
    else:
        # No checkpoint: the group before died before saving its first one (which it takes
        # before training anything), so the ledger holds nothing the model lacks.
        model = torch.zeros(a.epochs, train_batches, dtype=torch.int64)
        phases.start_fresh()
        note(fresh=True)
    maybe_die("restore")
    visits = torch.zeros_like(model)  # trained by this rank since the last checkpoint
    saves = 0

    def save_checkpoint():
        nonlocal model, saves
        data = phases.state_dict()
        saves += 1
        info = run.cut_info(data["cut"]) if rank == 0 else {}
        note(cut=data["cut"], save=saves, partial_batches=info.get("partial_batches"))
        maybe_die("cut", saves)
        total = visits.clone()
        dist.all_reduce(total)
        model = model + total
        visits.zero_()
        if rank == 0:
            tmp = path.with_suffix(".tmp")
            torch.save({"model": model, "data": data}, tmp)
            os.replace(tmp, path)
        maybe_die("save", saves)
        dist.barrier()

    if not path.exists():
        save_checkpoint()  # before training anything: a start to come back to
    checkpoints = {int(s) for s in a.checkpoints.split(",") if s}
    loaders = {s: DataLoader(Ids(n), batch_sampler=phases.sampler(s), num_workers=2,
                             prefetch_factor=2, persistent_workers=True)
               for s, n in (("train", a.train), ("dev", a.dev))}
    step = 0
    for phase in phases:
        # Every rank is in the same phase (the lockstep below depends on it).
        key = torch.tensor([phase.set == "dev", phase.epoch, phase.revisit], dtype=torch.int64)
        low, high = key.clone(), key.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not torch.equal(low, high):
            raise RuntimeError(f"ranks disagree on the phase: {low.tolist()} {high.tolist()}")
        note(phase=[phase.set, phase.epoch], revisit=phase.revisit)
        batches = iter(loaders[phase.set])
        dry = False
        while True:
            ids = None if dry else next(batches, None)
            dry = ids is None
            step += 1
            busy = torch.tensor([0 if dry else 1])
            dist.all_reduce(busy)
            if busy.item() == 0:
                break  # every rank's loader ran dry: the phase is over
            if step in checkpoints:
                save_checkpoint()
            if ids is None:
                continue
            ids = ids.tolist()
            b = ids[0] // a.batch_size
            assert ids == list(range(b * a.batch_size, min(a.train if phase.set == "train"
                                                             else a.dev,
                                                             (b + 1) * a.batch_size))), ids
            if phase.set == "train":
                visits[phase.epoch, b] += 1
            phase.report(batch_loss(phase.set, phase.epoch, b))
            note(step=step, set=phase.set, epoch=phase.epoch, batch=b)
            maybe_die("step", step)
    total = visits.clone()
    dist.all_reduce(total)
    model = model + total
    if rank == 0:
        torch.save({"model": model}, out / "final.pt")
    note(finished=run.finished.state if run.finished else None, steps=step)
    dist.barrier()
    run.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
