"""PyTorch integration: batch samplers fed by the coordinator (docs/PYTHON.md).

Each process (rank) is a worker of the run. An epoch of a set is a *phase*; a phase is a batch
sampler for a plain ``torch.utils.data.DataLoader`` that yields the sample indices of the
batches of the jobs the coordinator hands this rank. Report each batch after training it:

    run = traincoord.Run.from_env()
    phases = traincoord.torch.Phases(run, batch_size=32, sizes={"train": n_train, "dev": n_dev})
    for phase in phases:                         # ends when the run is finished or stopped early
        data = train_set if phase.set == "train" else dev_set
        for x, y in DataLoader(data, batch_sampler=phase, num_workers=4):
            loss = ...
            phase.report(loss.item())            # this batch is trained

A job is completed only once every one of its batches was reported, whatever the loader
fetched ahead (``num_workers``, ``prefetch_factor``, ``pin_memory``, ``persistent_workers``).
Batches the loader fetched but the loop never reported (a ``break``, an exception) are handed
back to the coordinator, job by job, when the next phase starts or the run is closed, and
another worker trains them. Jobs are fetched ahead and completions sent on a thread of its own
(``Run.feed``), so the loop does not wait for the coordinator between jobs.

Ranks of ``torch.distributed`` data parallel training take different numbers of steps: the
coordinator hands jobs to whichever rank asks (a slow rank takes fewer), and a rank's phase
ends as soon as the epoch has no job left for it. DDP's ``join()`` context (the
``torch.distributed.algorithms.Join`` family) lets the ranks that finished early shadow the
gradient all-reduces of the others, so nobody waits on a collective that will never come.

Checkpoints: save ``phases.state_dict()`` with the model (every rank calls it at the same
step), and give it back to ``phases.load_state_dict`` before iterating when the group restarts:
the coordinator then hands out exactly the batches the checkpointed model has not trained
(docs/PYTHON.md, "Checkpoints: state_dict and restore").
"""

from __future__ import annotations

import math
import os
import re
import secrets
import time
import warnings
from typing import Any, Callable, Iterator, Mapping

from .client import (CUT_INCOMPLETE, RESTORE_CONFLICT, CoordinatorError, Job, JobFeed, Run,
                     _field, log)
from .order import SHUFFLES, SampleOrder

__all__ = ["Phase", "Phases", "ReportError", "EpochSampler"]

FROM_RUN: Any = object()
"""Phases' default batch_size: the run's data.batch_size (None for a cost-balanced run)."""


class ReportError(RuntimeError):
    """A report that does not match a batch the loader handed out: too many reports, a report
    after the phase ended, or a report with no batch pending."""


class _Pending:
    """A job whose batches are in the loader: how many were yielded and reported, and the
    sums of what was reported."""

    __slots__ = ("job", "samples", "yielded", "reported", "loss", "weight", "metrics",
                 "seconds")

    def __init__(self, job: Job, samples: list[list[int]]) -> None:
        self.job, self.samples = job, samples
        self.yielded = self.reported = 0
        self.loss, self.weight = 0.0, 0
        self.metrics: dict[str, float] = {}
        self.seconds = 0.0  # the batches' times reported (report(seconds=...))


class Phase:
    """The batches one rank trains (or evaluates) in one epoch of one set: a batch sampler.
    Every epoch is a phase on every rank, an empty one when the rank got no job of it, so that
    DDP ranks enter the same join() contexts and per-epoch code runs on each of them.

    set, epoch: which epoch of which set. revisit: False for the rank's first phase of this
    epoch, True for a later one (a job of the epoch came back, e.g. from a rank that died, after
    this rank's first phase of it ended): per-epoch work belongs under ``if not
    phase.revisit`` or in ``Phases(on_epoch_end=...)``. jobs, batches, reported: counts so far.
    """

    def __init__(self, phases: "Phases", set_name: str, epoch: int, revisit: bool) -> None:
        self._phases = phases
        self.set, self.epoch, self.revisit = set_name, epoch, revisit
        self.jobs = self.batches = self.reported = 0
        self._pending: list[_Pending] = []  # in the order the loader got them
        self._iterated = False
        self._closed = False

    def __repr__(self) -> str:
        return (f"Phase(set={self.set!r}, epoch={self.epoch}, revisit={self.revisit}, "
                f"jobs={self.jobs}, batches={self.batches}, reported={self.reported})")

    def __iter__(self) -> Iterator[list[int]]:
        if self._iterated:
            raise RuntimeError(f"{self._name()} was iterated already: a phase is the batch "
                               "sampler of one pass (use Phases.sampler() for a DataLoader "
                               "kept across phases)")
        self._iterated = True
        feed = self._phases._feed
        while not self._closed:
            job = feed.head()
            if job is None or (job.set, job.epoch) != (self.set, self.epoch):
                return  # no job of this epoch right now: the next one waits in Phases
            feed.pop()
            pending = _Pending(job, job._samples)
            self._pending.append(pending)
            self.jobs += 1
            for samples in pending.samples:
                if self._closed:
                    return
                pending.yielded += 1
                self.batches += 1
                yield samples

    def __len__(self) -> int:  # unknown in advance; DataLoader only needs it for len()
        raise TypeError("a phase's length is decided by the coordinator as it goes")

    @property
    def loss_scale(self) -> float:
        """The factor to multiply the loss of the batch being trained (the oldest the loader
        handed out that no report covered yet) by before backward(). In step mode
        (schedule.mode = "steps") a step's batches may differ in size (the last steps of an
        epoch split what is left); with DDP averaging the ranks' gradients, this factor
        (n_rank * world_size / n_step) makes the step's gradient the mean over the step's
        samples. 1.0 in job mode and for a batch of a full step."""
        pending = next((p for p in self._pending if p.reported < p.yielded), None)
        return 1.0 if pending is None else pending.job.loss_scale

    def report(self, loss: float, samples: int | None = None, seconds: float | None = None,
               **metrics: float) -> None:
        """Reports the oldest batch the loader handed out and no report has covered yet: its
        loss (a float or a 0-dim tensor), its weight in the epoch's mean (default: its number
        of samples) and named metrics (e.g. accuracy). seconds: the batch's own compute time,
        which a cost-balanced step-mode run (schedule.batch_budget) fits its cost model from
        (time the forward and backward, not the wait for the other ranks in the all-reduce:
        a time that includes it makes every rank look as slow as the slowest). Once every
        batch of a job is reported, the job's sample-weighted mean loss is sent, in the
        background. Raises ReportError for a report with no batch pending or after the phase
        ended."""
        if self._closed:
            raise ReportError(f"{self._name()} has ended: this report comes after the next "
                              "phase started (or the run was closed), so it cannot be counted")
        pending = next((p for p in self._pending if p.reported < p.yielded), None)
        if pending is None:
            raise ReportError(f"{self._name()}: a report with no batch pending (the loader has "
                              f"handed out {self.batches} batches and {self.reported} were "
                              "reported): report each batch once, after training it")
        weight = len(pending.samples[pending.reported]) if samples is None else int(samples)
        if weight < 0:
            raise ReportError(f"{self._name()}: samples must be >= 0, got {weight}")
        loss = float(loss)
        if seconds is not None:
            seconds = float(seconds)
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ReportError(f"{self._name()}: seconds must be a finite number >= 0, got "
                                  f"{seconds}")
            pending.seconds += seconds
        pending.reported += 1
        self.reported += 1
        pending.loss += loss * weight
        pending.weight += weight
        for name, value in metrics.items():
            pending.metrics[name] = pending.metrics.get(name, 0.0) + float(value) * weight
        if pending.reported == len(pending.samples):
            self._pending.remove(pending)
            self._phases._feed.complete(pending.job, _result(pending))

    def _name(self) -> str:
        return f"phase {self.set} epoch {self.epoch}"

    def _close(self) -> None:
        """Ends the phase: jobs with batches never reported go back to the coordinator."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            unreported = sum(len(p.samples) - p.reported for p in self._pending)
            log.warning("%s: %d batches handed to the loader were not reported (the loop ended "
                        "early); jobs %s go back to the coordinator", self._name(), unreported,
                        ", ".join(str(p.job.index) for p in self._pending))
            self._phases._feed.release([p.job for p in self._pending])
            self._pending.clear()


STEPS_PER_REQUEST = 8
"""Step mode: the least number of a rank's steps fetched, and of its reports sent, per round
trip to the coordinator (Phases' feed holds up to twice as many ahead)."""


def _feed_shape(steps: bool, prefetch: int, batches_per_job: int) -> tuple[int, int | None]:
    """The JobFeed's depth (jobs held ahead) and jobs per round trip (None: half the depth).

    Job mode: enough jobs for `prefetch` batches; big jobs are fetched one ahead, so a rank
    never sits on jobs another rank could be training (dynamic sharding). Step mode: a job is
    one batch of one step, and a rank is handed only its own batches, so holding more ahead
    takes nothing from another rank: at least STEPS_PER_REQUEST steps per round trip (about
    prefetch / 2 for a larger prefetch), so that a step pays a fraction of a round trip's
    Python (~0.1-0.2 ms of CPU on the feed's thread, which shares the GIL with the loop)."""
    if steps:
        per_request = min(32, max(STEPS_PER_REQUEST, -(-prefetch // 2)))
        return 2 * per_request, per_request
    per_job = max(1, int(batches_per_job))
    return max(1, min(64, -(-prefetch // per_job))), None


def _result(p: _Pending) -> dict[str, Any]:
    n = p.weight
    mean = (p.loss / n if n else p.loss / max(1, p.reported))
    result: dict[str, Any] = {"loss": mean if math.isfinite(mean) else None, "samples": n}
    if p.metrics:
        result["metrics"] = {k: (v / n if n else v) for k, v in p.metrics.items()}
    if p.seconds > 0:
        result["seconds"] = p.seconds
    return result


class EpochSampler:
    """A batch sampler for a DataLoader kept across phases (``persistent_workers=True``): each
    iteration runs the current phase of Phases, which must be of this set."""

    def __init__(self, phases: "Phases", set_name: str) -> None:
        self._phases, self.set = phases, set_name

    def __iter__(self) -> Iterator[list[int]]:
        phase = self._phases.current
        if phase is None or phase.set != self.set:
            raise RuntimeError(f"the {self.set} sampler was iterated while the current phase "
                               f"is {phase!r}: iterate it inside `for phase in phases` when "
                               f"phase.set == {self.set!r}")
        return iter(phase)

    def __len__(self) -> int:
        raise TypeError("a phase's length is decided by the coordinator as it goes")


class Phases:
    """Iterates over the phases of a run for this rank, until the run ends.

    batch_size and sizes (samples per set: {"train": ..., "dev": ...}) default to the run's
    (data.batch_size, data.train_samples, data.dev_samples), so ``Phases(run)`` needs the run's
    shape written once, in its config; given here too, they must match it, else ValueError
    names both values. batch_size=None is for a cost-balanced run (schedule.batch_budget: the
    coordinator plans every batch), which is also its default. The coordinator's batch b of a set holds the
    samples at positions [b * batch_size, (b + 1) * batch_size) of that epoch's sample order:
    shuffle="epoch" (default) draws a fresh permutation every epoch, "fixed" one for the whole
    run, "none" keeps the data set's order (traincoord.order; seed defaults to the run's
    data.seed, so every rank agrees). prefetch: batches fetched ahead of the loader, in whole
    jobs (default 4: four jobs of one batch, one job of 4 or more); about half of them are
    fetched, and completions sent, per round trip: raise it for tiny jobs. In step mode a rank
    fetches at least STEPS_PER_REQUEST (8) of its steps per round trip (prefetch / 2 for a
    larger prefetch, at most 32) and holds up to twice as many: they are its own batches, so
    holding them takes nothing from another rank.
    on_epoch_end(set, epoch, record): called exactly once per epoch of each set that closes on
    the coordinator while this Phases runs, in order, before the next phase starts (also for
    epochs this rank got no job of), with the epoch's record from the run's status (loss,
    metrics, samples): the place for an LR scheduler's step, logging, checkpoints.

    group: the group of this start of the training job, sent on every request (a restarted
    group is a new one; the coordinator fences the old one off). Default: the run's own
    (``Run(group=...)``), else derived: $TRAINCOORD_GROUP (``traincoord launch`` sets it); else
    torchrun's $TORCHELASTIC_RUN_ID/$TORCHELASTIC_RESTART_COUNT; else, when torch.distributed
    is initialized, an id rank 0 makes and broadcasts (then every rank must create its Phases
    at the same point, as for any collective); else one of this process, taken now when the
    run has a group or cuts already, otherwise by the first ``state_dict``,
    ``load_state_dict`` or ``start_fresh`` (so that independent workers that never checkpoint
    stay ungrouped and do not fence each other off). cut_timeout: seconds ``state_dict`` waits
    for the other ranks' shares.
    """

    def __init__(self, run: Run, batch_size: int | None | object = FROM_RUN,
                 sizes: Mapping[str, int] | None = None, *,
                 shuffle: str = "epoch", seed: int | None = None, prefetch: int = 4,
                 on_epoch_end: Callable[[str, int, dict[str, Any]], None] | None = None,
                 group: str | None = None, cut_timeout: float = 600.0) -> None:
        if shuffle not in SHUFFLES:
            raise ValueError(f"shuffle must be one of {', '.join(SHUFFLES)}, got {shuffle!r}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1 (batches), got {prefetch}")
        self.run = run
        status = run.status()
        # Cost-balanced step mode: the coordinator plans every batch (no batch_size).
        self.cost_balanced = status["config"].get("batch_budget") is not None
        batch_size, sizes = _shape_from_run(run.run, status["config"], self.cost_balanced,
                                            batch_size, sizes)
        self.batch_size = batch_size
        if self.cost_balanced:
            _check_samples(run.run, status["config"], batch_size, sizes)
            self._orders: dict[str, SampleOrder | None] = {name: None for name in sizes}
        else:
            if batch_size is None:
                raise ValueError(f"batch_size is needed: run {run.run} has batches of a fixed "
                                 "size (None is for schedule.batch_budget)")
            _check_sizes(run.run, status["config"], batch_size, sizes)
            seed = status["config"]["seed"] if seed is None else seed
            self._orders = {name: SampleOrder(n, batch_size, seed, name, shuffle)
                            for name, n in sizes.items()}
        self._on_epoch_end = on_epoch_end
        self.cut_timeout = cut_timeout
        self._iterating = False
        if group is None and not run.group:
            group = _launcher_group()
            if group is None and (status.get("group") or (status.get("cuts") or {}).get("latest")):
                group = _process_group()  # a lineage with checkpoints: be fenced as one of it
        if group is not None and group != run.group:
            run.set_group(group)
        # Step mode: this process is one rank of a synchronous group, handed its rank's batch
        # of every step (a process on its own is a group of one). A run left to choose
        # (schedule.mode = "auto", the default) hands out steps when a rank of a group asks
        # first: this process is one under `traincoord launch`, torchrun, or in an initialized
        # process group.
        mode = status.get("mode", status["config"].get("mode"))
        self.steps = mode == "steps" or (mode == "auto" and _in_group())
        if self.steps:
            self._ensure_group()
            rank, world_size = _rank_and_world_size()
            if (run.rank, run.world_size) != (rank, world_size):
                run.set_rank(rank, world_size)
        elif mode == "jobs" and _rank_and_world_size()[1] > 1:
            warnings.warn(
                f"run {run.run} hands out jobs ({_why_jobs(status)}): the ranks of this group "
                "take different numbers of steps, so train inside "
                "model.join(divide_by_initial_world_size=False) or the ranks hang at an epoch's "
                "end; a run in step mode needs none (docs/PYTHON.md, \"DDP: copy this loop\")",
                stacklevel=2)
        self._warned_jobs = False
        self._read_status(status)
        self.current: Phase | None = None
        depth, per_request = _feed_shape(self.steps, prefetch, status["plan"]["batches_per_job"])
        self._feed: JobFeed = run.feed(depth, self._prepare, before_close=self._end_phase,
                                       per_request=per_request,
                                       warm_start=self.cost_balanced and self.steps)

    def _read_status(self, status: Mapping[str, Any] | None = None) -> None:
        """Takes the run's epochs as they are now (at the start, and after a restore): epochs
        closed already are not ours to announce or to enter (a resumed run, a late rank, a
        restored cut)."""
        if status is None:
            status = self.run.status()
        epochs = status["epochs"]
        if status.get("epochs_total", len(epochs)) > len(epochs):
            epochs = self.run.epochs()  # (the status lists the latest epochs only)
        self._announced = {(e["set"], e["epoch"]) for e in epochs if e["closed"]}
        self._seen: set[tuple[str, int]] = set(self._announced)
        # The epochs opened so far as this rank knows them, in opening order.
        self._order = [(e["set"], e["epoch"]) for e in epochs]

    # ---- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's part of a checkpoint cut: call it on every rank of the group at the same
        step (as torch.distributed.checkpoint.save), next to the model's state_dict. Sends the
        rank's queued completions, then its share of the cut — the jobs of the current phase it
        trained some but not all batches of (those reported so far) — and waits until every
        rank gave its share (at most cut_timeout seconds). Returns plain, picklable data
        ``{"traincoord": 1, "run": RUN, "cut": ID}`` to save with the model; the same on every
        rank. Raises CoordinatorError (code ``cut_incomplete``, naming the missing ranks) when
        the others did not come in time, ``stale_generation`` when a newer group took over."""
        self._ensure_group()
        # The n-th call of this rank in its group gives its share of the group's n-th cut
        # (counted per process, so a Phases made again in the same group goes on counting).
        key = (self.run.url, self.run.run, self.run.group)
        seq = _state_dicts.get(key, 0) + 1
        _state_dicts[key] = seq
        self._feed.flush()
        parts = []
        if self.current is not None:
            for p in self.current._pending:
                if 1 <= p.reported < len(p.samples):
                    parts.append({"lease": p.job.lease, "batches": p.reported, **_result(p)})
        rank, world_size = _rank_and_world_size()
        reply = self.run.cut(seq, rank, world_size, parts)
        cut = _field(reply, "cut", "int")
        deadline = time.monotonic() + self.cut_timeout
        pause = 0.005
        while not _field(reply, "complete", "bool"):
            if time.monotonic() >= deadline:
                missing = sorted(set(range(_field(reply, "world_size", "int")))
                                 - set(_field(reply, "ranks", "list")))
                raise CoordinatorError(
                    f"cut {cut} (state_dict call {seq} of group {self.run.group}) "
                    f"is not complete after {self.cut_timeout:g} s: ranks "
                    f"{', '.join(map(str, missing))} of {reply['world_size']} gave no share. "
                    "Every rank must call state_dict at the same step", code=CUT_INCOMPLETE)
            time.sleep(pause)
            pause = min(0.1, pause * 1.5)
            reply = self.run.cut_info(cut)
        return {"traincoord": 1, "run": self.run.run, "cut": cut}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores the cut a checkpoint holds (what ``state_dict`` returned): the coordinator
        puts the run back as of the cut (jobs completed after it reopened, a partly trained job
        reopened for its remaining batches, epochs and early stop after it undone) and makes
        this rank's group the current one. Every rank calls it (the first does the work, the
        others find it done), before iterating; raises RuntimeError after iteration started,
        ValueError for a state_dict of another run, CoordinatorError for a cut the coordinator
        does not keep (``cut_not_found``) or when this group restored another target
        (``restore_conflict``)."""
        self._before_iterating("load_state_dict")
        if not isinstance(state_dict, Mapping) or state_dict.get("traincoord") != 1 or \
                not isinstance(state_dict.get("cut"), int):
            raise ValueError(f"not a traincoord.torch.Phases state_dict: {state_dict!r:.200}")
        if state_dict.get("run") != self.run.run:
            raise ValueError(f"the state_dict is of run {state_dict.get('run')!r}, this Phases "
                             f"of run {self.run.run!r}")
        self._ensure_group()
        self.run.restore(cut=state_dict["cut"])
        self._read_status()

    def start_fresh(self) -> None:
        """Goes on from the coordinator's ledger as it is, without restoring a cut: what a
        restarted group without a checkpoint calls (jobs completed before are not trained
        again, though the fresh model never saw them). Before iterating, on every rank; needed
        only when the run has cuts (else the group simply takes the run over)."""
        self._before_iterating("start_fresh")
        self._ensure_group()
        took_over = self.run.group_state == "current" and self.run.latest_cut is None
        try:
            self.run.restore(fresh=True)
        except CoordinatorError as e:
            # The group took the run over as it registered (the run had no cut): the ledger
            # is already the one it goes on from.
            if e.code != RESTORE_CONFLICT or not took_over:
                raise
        self._read_status()

    def _before_iterating(self, what: str) -> None:
        if self._iterating:
            raise RuntimeError(f"{what} must be called before iterating over the phases (the "
                               "coordinator has handed this rank jobs already)")

    def _ensure_group(self) -> None:
        if not self.run.group:
            self.run.set_group(_launcher_group() or _process_group())

    def sampler(self, set_name: str) -> EpochSampler:
        """A batch sampler that follows the current phase of `set_name`, for one DataLoader
        kept across phases (e.g. with persistent_workers=True)."""
        if set_name not in self._orders:
            raise ValueError(f"no size was given for set {set_name!r}")
        return EpochSampler(self, set_name)

    def samples_of(self, set_name: str, epoch: int, batch: int) -> list[int]:
        """The sample indices of batch `batch` of epoch `epoch` of a set (not in cost-balanced
        step mode, whose batches the coordinator plans as it goes)."""
        order = self._orders[set_name]
        if order is None:
            raise ValueError("a cost-balanced run's batches are planned by the coordinator: "
                             "they come with each job (job.samples)")
        return order.batch(epoch, batch)

    def _prepare(self, job: Job) -> None:  # on the feed's thread, ahead of the loader
        try:
            order = self._orders[job.set]
        except KeyError:
            raise CoordinatorError(f"the coordinator handed out a {job.set} job, but Phases "
                                   f"was given no size for set {job.set!r}",
                                   field="sizes") from None
        if job.samples is not None:  # step mode: the coordinator lists the batch's samples
            job._samples = [job.samples]
            return
        if self.steps and not self._warned_jobs:
            # A run left to choose ("auto") that an independent worker asked first: it hands out
            # jobs for good, and this group's ranks take different numbers of steps.
            self._warned_jobs = True
            warnings.warn(
                f"run {self.run.run} hands out jobs, not steps: a worker that is not a rank of "
                "a group asked it for work first (schedule.mode = \"auto\"). Under DDP train "
                "inside model.join(divide_by_initial_world_size=False), or give the run "
                "mode = \"steps\" to refuse independent workers (docs/SEMANTICS.md, \"Which "
                "mode a run takes\")", stacklevel=2)
        job._samples = [order.batch(job.epoch, b) for b in job.batches]

    def __iter__(self) -> Iterator[Phase]:
        self._iterating = True
        try:
            while True:
                if self.current is not None:
                    self.current._close()
                feed = self._feed
                job = feed.head()
                if job is None and feed.finished is None:
                    # No job for this rank right now. An epoch it has not entered that is open
                    # (the others hold its last jobs) is entered at once, as an empty phase:
                    # DDP ranks training it need this rank in their join() context. Otherwise
                    # wait across the barrier for a job, the run's end, or such an epoch.
                    if feed.open_epoch is None or feed.open_epoch in self._seen:
                        job = feed.wait(until=lambda e: e is not None and e not in self._seen,
                                        epochs_opened=max(feed.epochs_opened, len(self._order)))
                    if job is None and (feed.open_epoch is None or feed.open_epoch in self._seen):
                        if feed.finished is None:
                            continue
                key = (job.set, job.epoch) if job is not None else feed.open_epoch
                if feed.finished is not None and job is None:
                    key = None
                yield from self._enter(key)
                if key is None:
                    self._feed.flush()
                    return  # the run is finished: run.finished says how
        finally:
            self.close()

    def _enter(self, key: tuple[str, int] | None) -> Iterator[Phase]:
        """Yields a phase for every epoch opened before `key` that this rank has not entered
        (empty: every epoch is a phase on every rank, so that DDP ranks enter the same join()
        contexts and per-epoch code runs on each), then the phase of `key` (None: the run is
        finished). The run's status is read only when an epoch opened that this rank did not
        see open, or for on_epoch_end."""
        records = None
        # The opened epochs are read from the first this rank has not passed (announced, with
        # on_epoch_end) on: the place of those before it in the order is known.
        behind = self._announced if self._on_epoch_end is not None else self._seen
        start = next((i for i, k in enumerate(self._order) if k not in behind), len(self._order))
        if key is None or key not in self._order:
            if key is not None and self._feed.epochs_opened == len(self._order) + 1:
                self._order.append(key)  # the one epoch opened since: no status needed
            else:
                records = self.run.epochs(start)  # opened epochs, in opening order
                self._order = self._order[:start] + [(e["set"], e["epoch"]) for e in records]
        if self._on_epoch_end is not None and records is None:
            records = self.run.epochs(start)
        for passed in self._order:
            if passed == key:
                break
            if passed not in self._seen:
                self._announce(records, passed)
                self._seen.add(passed)
                self.current = Phase(self, passed[0], passed[1], revisit=False)
                yield self.current
                self.current._close()
        self._announce(records, key)
        if key is not None:
            self.current = Phase(self, key[0], key[1], revisit=key in self._seen)
            self._seen.add(key)
            yield self.current

    def close(self) -> None:
        """Ends the current phase (handing back what was not reported) and the prefetching.
        Run.close() (and the end of the script) does this too."""
        self._feed.close()

    def _end_phase(self) -> None:
        if self.current is not None:
            self.current._close()

    def __enter__(self) -> "Phases":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _announce(self, epochs: list[dict[str, Any]] | None,
                  before: tuple[str, int] | None) -> None:
        """on_epoch_end for the closed epochs opened before `before` (all: None), in order."""
        if self._on_epoch_end is None or epochs is None:
            return
        for record in epochs:
            key = (record["set"], record["epoch"])
            if key == before:
                return
            if record["closed"] and key not in self._announced:
                self._announced.add(key)
                self._on_epoch_end(record["set"], record["epoch"], record)


_GROUP_CHARS = re.compile(r"[^A-Za-z0-9._:/-]")
_this_process_group: str | None = None
_state_dicts: dict[tuple[str, str, str | None], int] = {}  # calls per (url, run, group)


def _launcher_group() -> str | None:
    """The group a launcher names ($TRAINCOORD_GROUP; torchrun's run id and restart count), or
    one rank 0 of an initialized torch.distributed makes and broadcasts; None otherwise."""
    if os.environ.get("TRAINCOORD_GROUP"):
        return os.environ["TRAINCOORD_GROUP"]
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if run_id and restarts is not None:
        return _GROUP_CHARS.sub("-", f"{run_id}/{restarts}")[-128:]
    dist = _distributed()
    if dist is not None:
        made = [f"ddp-{secrets.token_hex(8)}" if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(made, src=0)
        return made[0]
    return None


def _process_group() -> str:
    """A group of this process alone, the same for every Phases in it."""
    global _this_process_group
    if _this_process_group is None:
        _this_process_group = f"proc-{secrets.token_hex(8)}"
    return _this_process_group


def _distributed() -> Any:
    """torch.distributed when it is initialized, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _in_group() -> bool:
    """Whether this process is a rank of a synchronous group: started by `traincoord launch`
    or torchrun (their environment says so), or in an initialized torch.distributed."""
    return bool(os.environ.get("TRAINCOORD_GROUP") or os.environ.get("TORCHELASTIC_RUN_ID")
                or _distributed() is not None)


def _why_jobs(status: Mapping[str, Any]) -> str:
    """Why a run hands out jobs, for a warning."""
    config = status["config"]
    if config.get("mode") == "jobs":
        return 'schedule.mode = "jobs"'
    if config.get("mode") == "auto" and not (config.get("train_samples")
                                             and config.get("batch_size")):
        return "steps need data.batch_size and data.train_samples in its config"
    if config.get("mode") == "auto":
        return ("an independent worker asked for work first, or its config cannot step: "
                "see docs/CONFIG.md, schedule.mode")
    return f"schedule.mode = {config.get('mode')!r}"


def _rank_and_world_size() -> tuple[int, int]:
    dist = _distributed()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _shape_from_run(run: str, config: Mapping[str, Any], cost_balanced: bool,
                    batch_size: Any, sizes: Mapping[str, int] | None
                    ) -> tuple[int | None, Mapping[str, int]]:
    """The batch size and set sizes Phases uses: those given, else the run's config's (whose
    absence is named, with the config field that would give it)."""
    if batch_size is FROM_RUN:
        if cost_balanced:
            batch_size = None
        elif config.get("batch_size"):
            batch_size = int(config["batch_size"])
        else:
            raise ValueError(f"run {run} has no data.batch_size: give batch_size= (samples per "
                             "batch), or set data.batch_size in the run's config")
    if sizes is None:
        sizes = {}
        for name in ("train", "dev"):
            if config.get(f"{name}_samples"):
                sizes[name] = int(config[f"{name}_samples"])
            elif config.get(f"{name}_batches"):
                raise ValueError(f"run {run} has {config[f'{name}_batches']} {name} batches but no "
                                 f"data.{name}_samples: give sizes={{{name!r}: ...}} (samples per "
                                 "set), or set it in the run's config")
    return batch_size, sizes


def _check_samples(run: str, config: Mapping[str, Any], batch_size: int | None,
                   sizes: Mapping[str, int]) -> None:
    """Cost-balanced step mode: no batch size; each set's size must be the run's."""
    if batch_size is not None:
        raise ValueError(f"run {run} plans cost-balanced batches (schedule.batch_budget = "
                         f"{config['batch_budget']}): give batch_size=None")
    for name, n in sizes.items():
        if name not in ("train", "dev"):
            raise ValueError(f"sizes has set {name!r}; sets are \"train\" and \"dev\"")
        known = config.get(f"{name}_samples", 0)
        if known != n:
            raise ValueError(f"sizes[{name!r}] = {n} but run {run} has data.{name}_samples = "
                             f"{known}")
    for name in ("train", "dev"):
        if config.get(f"{name}_samples") and name not in sizes:
            raise ValueError(f"run {run} has {config[f'{name}_samples']} {name} samples: give "
                             f"sizes[{name!r}]")


def _check_sizes(run: str, config: Mapping[str, Any], batch_size: int,
                 sizes: Mapping[str, int]) -> None:
    """Refuses a batch size or set sizes that disagree with the run's config."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if config.get("batch_size") and config["batch_size"] != batch_size:
        raise ValueError(f"batch_size={batch_size} but run {run} has data.batch_size = "
                         f"{config['batch_size']}")
    for name in sizes:
        if name not in ("train", "dev"):
            raise ValueError(f"sizes has set {name!r}; sets are \"train\" and \"dev\"")
    for name in ("train", "dev"):
        batches = config[f"{name}_batches"]
        if name not in sizes:
            if batches:
                raise ValueError(f"run {run} has {batches} {name} batches: give "
                                 f"sizes[{name!r}], the number of {name} samples")
            continue
        n = sizes[name]
        known = config.get(f"{name}_samples")
        if known is not None and known != n:
            raise ValueError(f"sizes[{name!r}] = {n} but run {run} has data.{name}_samples = "
                             f"{known}")
        if -(-n // batch_size) != batches:
            raise ValueError(f"sizes[{name!r}] = {n} samples in batches of {batch_size} make "
                             f"{-(-n // batch_size)} batches, but run {run} has "
                             f"data.{name}_batches = {batches}")

