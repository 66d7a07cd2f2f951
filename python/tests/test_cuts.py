"""Checkpoint cuts, restores and the data state_dict of traincoord.torch.Phases (issue 18).

The acceptance test is a model that counts its visits: a DDP group (gloo on loopback, a
prefetching DataLoader with 2 workers per rank; python/tests/cut_worker.py) trains a "model"
that is a count per (epoch, train batch), checkpoints {"model", "data": phases.state_dict()}
at seeded steps, and is killed at seeded moments — mid-job, right after a cut, right after a
checkpoint was written, during the restore, and at a random time — then restarted from its
latest checkpoint with a new random number of ranks. When the run has completed, the final
model's counts are exactly 1 for every (epoch, train batch), and the coordinator's epoch
losses are those of every batch trained exactly once.

A schedule is replayed from its seed: TRAINCOORD_CUT_SEEDS=7 (or 3,9 or 1-20) runs those."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import traincoord
import traincoord.torch
from traincoord.torch import Phases

HERE = Path(__file__).resolve().parent
TRAIN, DEV, BATCH, EPOCHS = 48, 11, 4, 3  # 12 train batches, 3 dev batches (the last of 3)
MAX_KILLS = 5  # kills per schedule; the start after the last one runs to the end
INCARNATION_TIMEOUT = 90.0


def cut_toml(batches_per_job):
    return f"""
name = "cuts"
[data]
train_samples = {TRAIN}
dev_samples = {DEV}
batch_size = {BATCH}
seed = 4
[schedule]
mode = "jobs"  # job-mode cuts: cut_worker.py's own lockstep over batches of sequential samples
epochs = {EPOCHS}
iters_per_worker = {batches_per_job}
validation_every = 1
[leases]
timeout = 60.0
"""


def seeds(default):
    spec = os.environ.get("TRAINCOORD_CUT_SEEDS", "")
    if not spec:
        return [default]
    out = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def batch_loss(set_name, epoch, batch):
    return (100.0 if set_name == "dev" else 0.0) + epoch + 0.001 * batch


def expected_epoch_loss(set_name, epoch):
    """The sample-weighted mean loss of an epoch whose every batch was trained once."""
    n = TRAIN if set_name == "train" else DEV
    sizes = [min(BATCH, n - b * BATCH) for b in range(-(-n // BATCH))]
    return sum(batch_loss(set_name, epoch, b) * s for b, s in enumerate(sizes)) / n


class Incarnation:
    """The N rank processes of one start of the group, each in a session of its own so that
    its DataLoader workers die with it."""

    def __init__(self, number, server, tmp_path, world_size, checkpoints, kill):
        self.number, self.world_size, self.kill = number, world_size, kill
        self.driver_killed = False
        self.group = f"inc-{number}"
        self.tmp = tmp_path
        store = tmp_path / f"store-{number}"
        self.procs, self.outputs = [], []
        for rank in range(world_size):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size),
                       TRAINCOORD_GROUP=self.group, GLOO_SOCKET_IFNAME="lo",
                       PYTHONDONTWRITEBYTECODE="1")
            env.pop("TORCHELASTIC_RUN_ID", None)
            output = open(tmp_path / f"{self.group}-r{rank}.out", "w")
            self.outputs.append(output)
            self.procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "cut_worker.py"), "--url", server.url,
                 "--run", "cuts", "--dir", str(tmp_path), "--store", str(store),
                 "--train", str(TRAIN), "--dev", str(DEV), "--batch-size", str(BATCH),
                 "--epochs", str(EPOCHS), "--checkpoints", ",".join(map(str, checkpoints)),
                 "--kill", kill if kill and not kill.startswith("driver") else ""],
                stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True))

    def wait(self):
        """Waits until every rank exited 0 (True), or one died (the rest are killed: False)."""
        kill_at = None  # the driver's kill: seconds after the group took the run over
        deadline = time.monotonic() + INCARNATION_TIMEOUT
        while True:
            codes = [p.poll() for p in self.procs]
            if all(c == 0 for c in codes):
                return True
            if any(c not in (None, 0) for c in codes):
                self.kill_all()
                return False
            if self.kill.startswith("driver") and kill_at is None and self.log(0):
                kill_at = time.monotonic() + float(self.kill.split(":")[2])
            if kill_at is not None and time.monotonic() >= kill_at:
                victim = self.procs[int(self.kill.split(":")[1]) % self.world_size]
                os.killpg(victim.pid, signal.SIGKILL)
                self.driver_killed = True
                kill_at = float("inf")
            if time.monotonic() > deadline:
                self.kill_all()
                raise AssertionError(f"{self.group} ({self.world_size} ranks) hung for "
                                     f"{INCARNATION_TIMEOUT:.0f} s:\n{self.tails()}")
            time.sleep(0.02)

    def kill_all(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for output in self.outputs:
            output.close()

    def planned_death(self):
        """Whether a rank died where the schedule said (not of an error of its own)."""
        return self.driver_killed or any("killed" in line for rank in range(self.world_size)
                   for line in self.log(rank))

    def log(self, rank):
        path = self.tmp / f"{self.group}-r{rank}.jsonl"
        return path.read_text().splitlines() if path.exists() else []

    def tails(self):
        out = []
        for rank in range(self.world_size):
            text = (self.tmp / f"{self.group}-r{rank}.out").read_text()
            out.append(f"--- {self.group} rank {rank} (exit {self.procs[rank].returncode}):\n"
                       f"{text[-3000:]}")
        return "\n".join(out)


def kill_plans(rng):
    """The kinds of deaths of a schedule, one per start: a rank mid-job (always), and four of
    mid-job again, right after a cut, right after a checkpoint was written, during the restore,
    at a random moment (the driver's kill)."""
    kinds = ["step", *rng.sample(["step", "cut", "save", "restore", "driver"], MAX_KILLS - 1)]
    rng.shuffle(kinds)
    return kinds


def kill_plan(rng, kind, world_size):
    """Where this start dies: RANK:WHERE:N for a rank's own SIGKILL (cut_worker.py --kill),
    driver:RANK:SECONDS for the driver's, that many seconds after rank 0 restored."""
    rank = rng.randrange(world_size)
    if kind == "step":
        return f"{rank}:step:{rng.randint(1, 24)}"
    if kind in ("cut", "save"):
        return f"{rank}:{kind}:{rng.randint(1, 3)}"
    if kind == "restore":
        return f"{rank}:restore:0"
    return f"driver:{rank}:{rng.uniform(0.0, 3.0):.2f}"


def run_schedule(serve_toml, tmp_path, seed, batches_per_job):
    rng = random.Random(seed)
    server = serve_toml(cut_toml(batches_per_job))
    started = time.monotonic()
    starts, deaths, sizes = [], 0, []
    live = None
    kinds = kill_plans(rng)
    try:
        while True:
            number = len(starts) + 1
            assert number <= MAX_KILLS + 3, "the run never completed"
            world_size = rng.randint(1, 3)
            checkpoints = sorted(rng.sample(range(2, 30), 4))
            kill = kill_plan(rng, kinds[deaths], world_size) if deaths < MAX_KILLS else ""
            live = Incarnation(number, server, tmp_path, world_size, checkpoints, kill)
            starts.append(f"{live.group}: {world_size} ranks, checkpoints at steps "
                          f"{checkpoints}, kill {kill or 'none'}")
            sizes.append(world_size)
            finished = live.wait()
            live.kill_all()
            if finished:
                break
            if not live.planned_death():
                raise AssertionError(f"{live.group} failed:\n{live.tails()}")
            deaths += 1
            live = None
        with traincoord.Run(server.url, "cuts", "checker", heartbeats=False) as run:
            status = run.status()
        assert status["state"] == "completed", status["reason"]
        model = torch.load(tmp_path / "final.pt")["model"]
        assert model.shape == (EPOCHS, -(-TRAIN // BATCH))
        if not torch.equal(model, torch.ones_like(model)):
            wrong = [(e, b, int(model[e, b])) for e in range(model.shape[0])
                     for b in range(model.shape[1]) if model[e, b] != 1]
            raise AssertionError(f"visits that are not exactly 1 (epoch, batch, count): {wrong}")
        epochs = status["epochs"]
        assert [(e["set"], e["epoch"]) for e in epochs] == [
            (s, e) for e in range(EPOCHS) for s in ("train", "dev")]
        for e in epochs:
            assert e["closed"] and e["done"] == e["jobs"], e
            assert e["samples"] == (TRAIN if e["set"] == "train" else DEV), e
            assert e["loss"] == pytest.approx(expected_epoch_loss(e["set"], e["epoch"]),
                                              rel=1e-12), e
        counters = status["counters"]
        partial = sum(json.loads(line).get("partial_batches") or 0
                      for path in tmp_path.glob("inc-*-r0.jsonl")
                      for line in path.read_text().splitlines())
        print(f"\nseed {seed}, jobs of {batches_per_job} batches: {len(starts)} starts "
              f"(ranks {sizes}), {deaths} kills, {counters['cuts']} cuts, "
              f"({partial} partly trained batches), {counters['restores']} restores, "
              f"{counters['jobs_withdrawn']} jobs withdrawn, "
              f"{counters['leases_voided']} leases voided, generation {status['generation']}, "
              f"{time.monotonic() - started:.1f} s")
        for line in starts:
            print("  " + line)
    except BaseException as e:
        raise AssertionError(f"seed {seed} (replay: TRAINCOORD_CUT_SEEDS={seed}), jobs of "
                             f"{batches_per_job} batches, starts:\n  " + "\n  ".join(starts) +
                             f"\n{e}") from e
    finally:
        if live is not None:
            live.kill_all()


@pytest.mark.parametrize("seed", seeds(12))
def test_a_model_that_counts_its_visits_sees_every_batch_once_jobs_of_one_batch(
        serve_toml, tmp_path, seed):
    run_schedule(serve_toml, tmp_path, seed, batches_per_job=1)


@pytest.mark.parametrize("seed", seeds(17))
def test_a_model_that_counts_its_visits_sees_every_batch_once_jobs_of_three_batches(
        serve_toml, tmp_path, seed):
    run_schedule(serve_toml, tmp_path, seed, batches_per_job=3)


# ---- in one process: the refusals, a partly trained job, fresh starts, group derivation ----

SMALL_TOML = """
name = "small"
[data]
train_samples = 24
dev_samples = 8
batch_size = 4
seed = 2
[schedule]
epochs = 2
iters_per_worker = 3
validation_every = 1
[leases]
timeout = 60.0
"""


@pytest.fixture
def small(serve_toml, monkeypatch):
    for name in ("TRAINCOORD_GROUP", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                 "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return serve_toml(SMALL_TOML)


def phases_of(server, name, group=None):
    run = traincoord.Run(server.url, "small", name, long_poll=1)
    return run, Phases(run, batch_size=4, sizes={"train": 24, "dev": 8}, shuffle="none",
                       group=group)


def refused(code, call, *args):
    with pytest.raises(traincoord.CoordinatorError) as e:
        call(*args)
    assert e.value.code == code, (e.value.code, e.value.message)
    return e.value


def test_a_partly_trained_job_is_restored_with_its_remaining_batches_only(small):
    run, phases = phases_of(small, "first", group="g1")
    it = iter(phases)  # (kept: a dropped generator closes the Phases)
    phase = next(it)
    batches = iter(phase)
    first = next(batches)  # the loader fetched 2 batches of a job of 3 ...
    next(batches)
    job = phase._pending[0].job
    phase.report(2.5)  # ... and trained 1
    state = phases.state_dict()
    assert state == {"traincoord": 1, "run": "small", "cut": state["cut"]}
    cut = run.cut_info(state["cut"])
    assert cut["complete"] and (cut["partial_jobs"], cut["partial_batches"]) == (1, 1)
    assert cut["world_size"] == 1 and cut["ranks"] == [0] and cut["group"] == "g1"
    assert run.cuts()["cuts"][-1]["id"] == state["cut"]
    phase.report(7.0)  # trained after the cut: the restore forgets it
    phases.close()
    run.close()

    run2, phases2 = phases_of(small, "second", group="g2")
    assert run2.group_state == "restore_required" and run2.latest_cut == state["cut"]
    phases2.load_state_dict(state)
    it2 = iter(phases2)
    again = next(it2)
    assert (again.set, again.epoch) == ("train", 0)
    handed = []
    for samples in again:
        handed.append(samples)
        again.report(1.0 if samples[0] // 4 in job.batches else 0.5)
    # The job comes back with its 2 untrained batches; the first batch stays trained.
    assert [s[0] // 4 for s in handed[:2]] == job.batches[1:]
    assert first[0] // 4 == job.batches[0] and first[0] not in [s[0] for s in handed]
    phases2.close()
    epoch = run2.status()["epochs"][0]
    assert epoch["done"] == epoch["jobs"] and epoch["samples"] == 24
    # Batch 1 of the job at 2.5, its other 2 at 1.0, the other job's 3 batches at 0.5.
    assert epoch["loss"] == pytest.approx((2.5 + 2 * 1.0 + 3 * 0.5) / 6, rel=1e-12)
    run2.close()


def test_the_old_group_still_alive_is_refused_and_never_counted(small):
    old, old_phases = phases_of(small, "old", group="g1")
    it = iter(old_phases)
    phase = next(it)
    batches = iter(phase)
    next(batches)
    state = old_phases.state_dict()  # nothing trained yet
    for _ in range(2):
        next(batches)
    for _ in range(3):
        phase.report(1.0)  # a whole job, queued ...
    old_phases._feed.flush()  # ... and counted, after the cut
    done_before = old.status()["progress"]["jobs_done"]
    assert done_before == 1

    new, new_phases = phases_of(small, "new", group="g2")
    new_phases.load_state_dict(state)
    status = new.status()
    assert status["group"] == "g2" and status["progress"]["jobs_done"] == 0
    assert status["counters"]["jobs_withdrawn"] == 1
    # The old process goes on: its next request is refused, its report never counted.
    next(batches)
    phase.report(1.0)
    with pytest.raises(traincoord.CoordinatorError) as e:
        for _ in batches:
            phase.report(1.0)
        old_phases._feed.flush()
    assert e.value.code == traincoord.STALE_GENERATION, e.value.message
    refused(traincoord.STALE_GENERATION, old.next_job)
    refused(traincoord.STALE_GENERATION, old.set_group, "g1")  # registering again too
    assert new.status()["progress"]["jobs_done"] == 0
    # The new group trains the run to its end.
    for p in new_phases:
        for _ in p:
            p.report(0.5)
    assert new.finished.state == "completed"
    assert new.status()["progress"]["jobs_done"] == new.status()["progress"]["jobs_planned"]
    new.close()
    old_phases.close()
    old.close()


def test_a_new_group_that_does_not_restore_is_refused_until_it_starts_fresh(small):
    run, phases = phases_of(small, "first", group="g1")
    it = iter(phases)
    p = next(it)  # train epoch 0 (2 jobs) whole, then a cut
    for _ in p:
        p.report(1.0)
    state = phases.state_dict()
    phases.close()
    run.close()
    late, late_phases = phases_of(small, "late", group="g2")
    assert late.group_state == "restore_required" and late.latest_cut == state["cut"]
    e = refused(traincoord.RESTORE_REQUIRED, lambda: next(iter(late_phases)))
    assert "load_state_dict" in e.message and "fresh" in e.message
    late_phases.close()
    with pytest.raises(RuntimeError, match="before iterating"):
        late_phases.load_state_dict(state)
    late.close()
    # A group without the checkpoint goes on from the ledger as it is.
    fresh, fresh_phases = phases_of(small, "fresh", group="g3")
    refused(traincoord.CUT_NOT_FOUND, fresh_phases.load_state_dict, {**state, "cut": 999})
    with pytest.raises(ValueError, match="of run 'other'"):
        fresh_phases.load_state_dict({**state, "run": "other"})
    fresh_phases.start_fresh()
    fresh_phases.start_fresh()  # every rank calls it: the second finds it done
    assert fresh.status()["progress"]["jobs_done"] == 2  # the ledger as it was
    refused(traincoord.RESTORE_CONFLICT, fresh_phases.load_state_dict, state)
    seen = []
    for p in fresh_phases:
        seen.append((p.set, p.epoch))
        for _ in p:
            p.report(1.0)
    assert seen == [("dev", 0), ("train", 1), ("dev", 1)]
    assert fresh.finished.state == "completed"
    fresh.close()


def test_the_group_is_derived_from_the_launcher_and_ungrouped_workers_stay_so(small, monkeypatch):
    run, phases = phases_of(small, "a")
    assert run.group is None  # no launcher, no torch.distributed, no cuts: not fenced
    other, other_phases = phases_of(small, "b")
    assert other.group is None
    for p in other_phases:  # two independent workers share the run, as before cuts
        for _ in p:
            p.report(1.0)
        break
    # A state_dict of an ungrouped worker takes a group of this process for it.
    alone, alone_phases = phases_of(small, "e")
    assert alone.group is None
    state = alone_phases.state_dict()
    assert alone.group.startswith("proc-") and run.cut_info(state["cut"])["complete"]
    assert run.status()["generation"] == 1
    # Now that the run has a group and cuts, a new worker is grouped at once (this process's
    # group, the current one).
    late, _ = phases_of(small, "f")
    assert late.group == alone.group and late.group_state == "current"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job 7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    elastic, _ = phases_of(small, "c")
    assert elastic.group == "job-7/2" and elastic.group_state == "restore_required"
    monkeypatch.setenv("TRAINCOORD_GROUP", "launched-0")
    launched, _ = phases_of(small, "d")
    assert launched.group == "launched-0" and launched.group_state == "restore_required"
    explicit, _ = phases_of(small, "g", group="mine")
    assert explicit.group == "mine"
    for r in (run, other, alone, late, elastic, launched, explicit):
        r.close()


def test_refusals_of_cuts_and_restores_carry_their_codes(small, monkeypatch):
    run = traincoord.Run(small.url, "small", "w", group="r1")
    job = run.next_job()
    assert len(job.batches) == 3
    part = {"lease": job.lease, "batches": 1, "loss": 1.0, "samples": 4}
    half = run.cut(1, 0, 2, [part])
    assert not half["complete"] and half["ranks"] == [0] and half["world_size"] == 2
    assert run.cut(1, 0, 2, [part]) == half  # the same rank again
    refused(traincoord.CUT_MISMATCH, run.cut, 1, 1, 3, [])
    refused("invalid_argument", run.cut, 1, 2, 2, [])  # rank >= world_size
    refused("invalid_argument", run.cut, 2, 0, 1, [{**part, "batches": 3}])  # the whole job
    refused(traincoord.LEASE_UNKNOWN, run.cut, 2, 0, 1, [{**part, "lease": 10**9}])
    refused(traincoord.CUT_INCOMPLETE, run._request, "POST", "/v1/runs/small/restore",
            {"group": "r2", "cut": half["cut"]}, 0)
    refused(traincoord.CUT_NOT_FOUND, run.cut_info, 999)
    run.release([job])
    refused(traincoord.LEASE_NOT_HELD, run.cut, 2, 0, 1, [part])
    with pytest.raises(ValueError):
        run.restore()
    ungrouped = traincoord.Run(small.url, "small", "u", heartbeats=False)
    e = refused("invalid_argument", ungrouped.cut, 1, 0, 1, [])
    assert e.field == "group"
    # state_dict waits for the other ranks, and names those that did not come.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    phases = Phases(run, batch_size=4, sizes={"train": 24, "dev": 8}, cut_timeout=0.3)
    e = refused(traincoord.CUT_INCOMPLETE, phases.state_dict)
    assert "ranks 1 of 2" in e.message
    phases.close()
    for r in (run, ungrouped):
        r.close()
