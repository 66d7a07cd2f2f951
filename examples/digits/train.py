"""A real PyTorch model trained with DDP on scikit-learn's handwritten digits, fed by traincoord.

    traincoord launch --workers 4 --config examples/digits/digits.toml -- \
        /usr/bin/python3 examples/digits/train.py --checkpoint /tmp/digits-best.pt

Each rank is a traincoord worker. The coordinator hands each rank jobs (batch indices) of the
current epoch; the ranks train a small MLP with DistributedDataParallel (gloo, CPU), report each
job's loss, evaluate the dev set in jobs too, and the coordinator decides when to stop (patience
on the dev loss). Rank 0 keeps the checkpoint of the best epoch and prints each epoch's losses
and accuracies.
"""

import argparse
import contextlib
import os
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
    return (torch.utils.data.TensorDataset(x[train], y[train]),
            torch.utils.data.TensorDataset(x[dev], y[dev]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", default="digits-best.pt")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--die-at-epoch", type=int, default=-1,
                        help="exit abruptly at the start of this train epoch (rank 1)")
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
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    run = traincoord.Run.from_env(long_poll=20)
    best = {}

    def epoch_ended(set_name, epoch, record):
        """Once per epoch on every rank, after the coordinator closed it (so its loss is
        final and early stopping has judged it): rank 0 prints it and keeps the best model."""
        if set_name == "dev" and rank == 0:
            report(run, epoch, record, model, args.checkpoint, best)

    phases = traincoord.torch.Phases(run, batch_size=32, sizes={"train": TRAIN, "dev": DEV},
                                     on_epoch_end=epoch_ended)
    options = {"num_workers": args.loader_workers}
    for phase in phases:
        if phase.set == "train":
            if rank == 1 and phase.epoch == args.die_at_epoch:
                os._exit(137)
            ddp.train()
            # DDP's join: ranks that run out of jobs first shadow the others' all-reduces.
            join = (ddp.join(divide_by_initial_world_size=False) if distributed
                    else contextlib.nullcontext())
            with join:
                for x, y in torch.utils.data.DataLoader(train_set, batch_sampler=phase, **options):
                    optimizer.zero_grad()
                    loss = loss_fn(ddp(x), y)
                    loss.backward()
                    optimizer.step()
                    phase.report(loss.item())  # after the step: this batch is trained
        else:
            model.eval()
            with torch.no_grad():
                for x, y in torch.utils.data.DataLoader(dev_set, batch_sampler=phase, **options):
                    out = model(x)
                    accuracy = (out.argmax(1) == y).float().mean().item()
                    phase.report(loss_fn(out, y).item(), accuracy=accuracy)
    if rank == 0:
        print(f"run {run.finished.state}: {run.finished.reason}", flush=True)
        if best:
            print(f"best epoch {best['epoch']}: dev loss {best['loss']:.4f}, dev accuracy "
                  f"{best['accuracy']:.4f}; checkpoint {args.checkpoint}", flush=True)
    run.close()
    if distributed:
        dist.destroy_process_group()


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
