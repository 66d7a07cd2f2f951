"""PyTorch integration: batch samplers fed by the coordinator (docs/PYTHON.md).

Each process (rank) is a worker of the run. An epoch of a set is a *phase*; a phase is a batch
sampler for a plain ``torch.utils.data.DataLoader`` that yields the sample indices of the
batches of the jobs the coordinator hands this rank, and reports each job's loss back:

    run = traincoord.Run.from_env()
    phases = traincoord.torch.Phases(run, batch_size=32, sizes={"train": n_train, "dev": n_dev})
    for phase in phases:                         # ends when the run is finished or stopped early
        data = train_set if phase.set == "train" else dev_set
        with model.join() if phase.set == "train" else contextlib.nullcontext():
            for x, y in DataLoader(data, batch_sampler=phase):
                loss = ...
                phase.report(loss.item(), len(y))

Ranks of ``torch.distributed`` data parallel training take different numbers of steps: the
coordinator hands jobs to whichever rank asks (a slow rank takes fewer), and a rank's phase
ends as soon as the epoch has no job left for it. DDP's ``join()`` context (the
``torch.distributed.algorithms.Join`` family) lets the ranks that finished early shadow the
gradient all-reduces of the others, so nobody waits on a collective that will never come.
This keeps dynamic sharding; handing every rank the same number of steps would force the
slowest rank's pace on all of them.
"""

from __future__ import annotations

import random
from typing import Iterator, Mapping

from .client import Job, Run


class Phase:
    """The batches one rank trains (or evaluates) in one epoch of one set: a batch sampler."""

    def __init__(self, phases: "Phases", first: Job) -> None:
        self._phases = phases
        self.set = first.set
        self.epoch = first.epoch
        self._first: Job | None = first
        self._job: Job | None = None
        self._loss = 0.0
        self._samples = 0
        self._metrics: dict[str, float] = {}
        self.jobs = 0
        self.batches = 0

    def report(self, loss: float, samples: int, **metrics: float) -> None:
        """The loss (and named metrics, e.g. accuracy) of the batch just yielded."""
        self._loss += float(loss) * samples
        self._samples += int(samples)
        for name, value in metrics.items():
            self._metrics[name] = self._metrics.get(name, 0.0) + float(value) * samples

    def _finish_job(self) -> Job | None:
        """Completes the current job with what was reported, and takes the next one."""
        job, self._job = self._job, None
        n = max(1, self._samples)
        metrics = {k: v / n for k, v in self._metrics.items()}
        job._result = {"loss": self._loss / n, "samples": self._samples}
        if metrics:
            job._result["metrics"] = metrics
        self._loss, self._samples, self._metrics = 0.0, 0, {}
        return self._phases.run._complete(job, next_job=True, wait=False)

    def __iter__(self) -> Iterator[list[int]]:
        job, self._first = self._first, None
        while job is not None and (job.set, job.epoch) == (self.set, self.epoch):
            self._job = job
            self.jobs += 1
            for b in job.batches:
                self.batches += 1
                yield self._phases.samples_of(job.set, b)
            job = self._finish_job()
        # The next job belongs to the next phase (or there is none right now: wait for it there).
        self._phases._pending = job

    def __len__(self) -> int:  # unknown in advance; DataLoader only needs it for len()
        raise TypeError("a phase's length is decided by the coordinator as it goes")


class Phases:
    """Iterates over the phases of a run for this rank, until the run ends.

    batch_size: samples per batch; sizes: samples per set ({"train": ..., "dev": ...}); the
    coordinator's batch b of a set holds the samples [b * batch_size, (b + 1) * batch_size) of
    that set in a fixed order, shuffled once with `seed` (so that batches mix classes)."""

    def __init__(self, run: Run, batch_size: int, sizes: Mapping[str, int], seed: int = 0) -> None:
        self.run = run
        self.batch_size = batch_size
        self._order = {}
        for name, n in sizes.items():
            order = list(range(n))
            random.Random(f"{seed}/{name}").shuffle(order)
            self._order[name] = order
        self._pending: Job | None = None

    def samples_of(self, set_name: str, batch: int) -> list[int]:
        order = self._order[set_name]
        return order[batch * self.batch_size:(batch + 1) * self.batch_size]

    def __iter__(self) -> Iterator[Phase]:
        while True:
            job, self._pending = self._pending, None
            if job is None:
                job = self.run.next_job(wait=True)  # long-polls across the epoch barrier
            if job is None:
                return  # the run is finished: run.finished says how
            yield Phase(self, job)
