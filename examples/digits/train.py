"""A real PyTorch model trained with DDP on scikit-learn's handwritten digits, fed by traincoord.

    traincoord launch --workers 4 --config examples/digits/digits.toml -- \
        /usr/bin/python3 examples/digits/train.py --checkpoint /tmp/digits-best.pt

Each rank is a traincoord worker. The coordinator hands each rank jobs (batch indices) of the
current epoch; the ranks train a small MLP with DistributedDataParallel (gloo, CPU), report each
job's loss, evaluate the dev set in jobs too, and the coordinator decides when to stop (patience
on the dev loss). Rank 0 keeps the checkpoint of the best epoch and prints each epoch's losses
and accuracies.

With --state PATH, the ranks also save a checkpoint to resume from at the end of every train
epoch: the model, the optimizer, the data's state_dict (a checkpoint cut of the coordinator) and
how often each sample of each epoch went into the model. A group that restarts (traincoord
launch --max-restarts) loads it and goes on from there: the coordinator reopens what was trained
after the cut, so at the end every sample of every epoch is in the final model exactly once,
which the script checks and prints (scripts/demo-elastic).
"""

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from sklearn.datasets import load_digits

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import traincoord  # noqa: E402
import traincoord.torch  # noqa: E402

TRAIN, DEV = 1437, 360  # as in digits.toml


def datasets():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    g = torch.Generator().manual_seed(0)  # the same split on every rank
    perm = torch.randperm(len(y), generator=g)
    train, dev = perm[:TRAIN], perm[TRAIN:TRAIN + DEV]
    # Each item also carries its index in its set, for counting what the model saw.
    return (torch.utils.data.TensorDataset(x[train], y[train], torch.arange(TRAIN)),
            torch.utils.data.TensorDataset(x[dev], y[dev], torch.arange(DEV)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", default="digits-best.pt")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--die-at-epoch", type=int, default=-1,
                        help="rank 1 kills itself (SIGKILL) a few batches into this train "
                             "epoch, in the first start of the group only")
    parser.add_argument("--state", default="",
                        help="checkpoint to resume from, saved at the end of every train epoch")
    parser.add_argument("--loader-workers", type=int, default=0,
                        help="DataLoader num_workers (each rank's loader processes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0

    train_set, dev_set = datasets()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    # How often each train sample of each epoch went into the model: in the checkpoint (the
    # model's lineage), and what this rank trained since (summed over the ranks at a checkpoint).
    visits = torch.zeros(64, TRAIN, dtype=torch.int32)
    mine = torch.zeros_like(visits)
    saved = torch.load(args.state) if args.state and os.path.exists(args.state) else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optim"])
        visits = saved["visits"]
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model

    run = traincoord.Run.from_env(long_poll=20)
    best = {}

    def epoch_ended(set_name, epoch, record):
        """Once per epoch on every rank, after the coordinator closed it (so its loss is
        final and early stopping has judged it): rank 0 prints it and keeps the best model;
        after a train epoch, every rank takes part in the checkpoint to resume from."""
        if set_name == "dev" and rank == 0:
            report(run, epoch, record, model, args.checkpoint, best)
        if set_name == "train" and args.state:
            checkpoint()

    def checkpoint():
        data = phases.state_dict()  # every rank, at the same step: the coordinator's cut
        if distributed:
            dist.all_reduce(mine)
        visits.add_(mine)
        mine.zero_()
        if rank == 0:
            torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(),
                        "data": data, "visits": visits}, args.state + ".tmp")
            os.replace(args.state + ".tmp", args.state)

    phases = traincoord.torch.Phases(run, batch_size=32, sizes={"train": TRAIN, "dev": DEV},
                                     on_epoch_end=epoch_ended)
    if saved is not None:
        phases.load_state_dict(saved["data"])  # the data goes on where the model stands
        if rank == 0:
            print(f"resumed from {args.state} (cut {saved['data']['cut']})", flush=True)
    elif args.state:
        checkpoint()  # a checkpoint before training: a restart before the first epoch ends
        # begins again from here, not from the ledger
    first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    options = {"num_workers": args.loader_workers}
    for phase in phases:
        if phase.set == "train":
            doomed = rank == 1 and phase.epoch == args.die_at_epoch and first_start
            ddp.train()
            # Step mode (the demo's config): every rank gets the same steps. In job mode, DDP's
            # join: ranks that run out of jobs first shadow the others' all-reduces.
            join = (ddp.join(divide_by_initial_world_size=False)
                    if distributed and not phases.steps else contextlib.nullcontext())
            with join:
                loader = torch.utils.data.DataLoader(train_set, batch_sampler=phase, **options)
                for step, (x, y, i) in enumerate(loader):
                    if doomed and step == 5:
                        os.kill(os.getpid(), signal.SIGKILL)
                    optimizer.zero_grad()
                    loss = loss_fn(ddp(x), y)
                    (loss * phase.loss_scale).backward()  # the step's mean over its samples
                    optimizer.step()
                    mine[phase.epoch, i] += 1
                    phase.report(loss.item())  # after the step: this batch is trained
        else:
            model.eval()
            with torch.no_grad():
                for x, y, _ in torch.utils.data.DataLoader(dev_set, batch_sampler=phase, **options):
                    out = model(x)
                    accuracy = (out.argmax(1) == y).float().mean().item()
                    phase.report(loss_fn(out, y).item(), accuracy=accuracy)
    if rank == 0:
        print(f"run {run.finished.state}: {run.finished.reason}", flush=True)
        if args.state:
            check_exactly_once(run, visits)
        if best:
            print(f"best epoch {best['epoch']}: dev loss {best['loss']:.4f}, dev accuracy "
                  f"{best['accuracy']:.4f}; checkpoint {args.checkpoint}", flush=True)
    run.close()
    if distributed:
        dist.destroy_process_group()


def check_exactly_once(run, visits):
    """Prints whether every sample of every train epoch the run closed is in the final model's
    lineage exactly once (the visits saved with the last checkpoint)."""
    closed = [e["epoch"] for e in run.status()["epochs"] if e["set"] == "train" and e["closed"]]
    counts = visits[closed]
    beyond = visits[max(closed) + 1:] if closed else visits
    ok = bool((counts == 1).all()) and not bool(beyond.any())
    print(f"every sample of train epochs {min(closed)}..{max(closed)} in the final model exactly "
          f"once: {'yes' if ok else 'NO'} ({int(counts.sum())} sample visits, "
          f"{len(closed)} x {TRAIN} samples; min {int(counts.min())}, max {int(counts.max())})",
          flush=True)
    if not ok:
        sys.exit(1)


def report(run, epoch, dev, model, checkpoint, best):
    """Prints epoch `epoch`'s losses and accuracy; saves the model if it is the best epoch."""
    status = run.status()
    train = next(e for e in status["epochs"] if (e["set"], e["epoch"]) == ("train", epoch))
    accuracy = dev["metrics"].get("accuracy", float("nan"))
    line = (f"epoch {epoch:2d}  train loss {train['loss']:.4f}  dev loss {dev['loss']:.4f}  "
            f"dev accuracy {accuracy:.4f}")
    if status["early_stop"]["best_epoch"] == epoch:
        torch.save(model.state_dict(), checkpoint)
        best.update(epoch=epoch, loss=dev["loss"], accuracy=accuracy)
        line += "  (best so far: saved)"
    print(line, flush=True)


if __name__ == "__main__":
    main()
