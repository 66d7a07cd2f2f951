"""traincoord.torch.Phases without a DataLoader: reports, refusals, hooks, revisits."""

import logging

import pytest

import traincoord
import traincoord.torch
from traincoord.torch import Phases, ReportError

PHASES_TOML = """
name = "phases"
[data]
train_samples = 40
dev_samples = 10
batch_size = 4
seed = 3
[schedule]
epochs = 3
iters_per_worker = 2
validation_every = 1
[leases]
timeout = 1.0
"""


@pytest.fixture
def phases_server(serve_toml):
    return serve_toml(PHASES_TOML)


def test_settings_that_disagree_with_the_run_are_refused_naming_both(phases_server):
    with traincoord.Run(phases_server.url, "phases", "w") as run:
        with pytest.raises(ValueError, match="batch_size=8 but run phases has data.batch_size = 4"):
            Phases(run, batch_size=8, sizes={"train": 40, "dev": 10})
        with pytest.raises(ValueError, match=r"sizes\['train'\] = 41 but run phases has "
                                             r"data.train_samples = 40"):
            Phases(run, batch_size=4, sizes={"train": 41, "dev": 10})
        with pytest.raises(ValueError, match=r"give sizes\['dev'\]"):
            Phases(run, batch_size=4, sizes={"train": 40})


def test_phases_of_the_run_alone_takes_its_shape_from_the_run(phases_server):
    with traincoord.Run(phases_server.url, "phases", "w") as run:
        phases = Phases(run)  # batch size and set sizes written once, in the run's config
        assert phases.batch_size == 4
        seen = {}
        for phase in phases:
            for batch in phase:
                seen.setdefault((phase.set, phase.epoch), []).extend(batch)
                phase.report(1.0)
        # every sample of every epoch once, as the config's sizes say
        assert sorted(seen) == [("dev", 0), ("dev", 1), ("dev", 2),
                                ("train", 0), ("train", 1), ("train", 2)]
        for (set_name, _), samples in seen.items():
            assert sorted(samples) == list(range(40 if set_name == "train" else 10))


def test_a_run_without_its_sizes_in_the_config_asks_for_them_naming_the_field(serve_toml):
    server = serve_toml("""
name = "batches_only"
[data]
train_batches = 10
batch_size = 4
[schedule]
epochs = 1
""")
    with traincoord.Run(server.url, "batches_only", "w") as run:
        with pytest.raises(ValueError, match=r"no data.train_samples: give sizes="):
            Phases(run)
        Phases(run, sizes={"train": 40}).close()  # given in the script, it is checked instead
    server2 = serve_toml("""
name = "no_batch_size"
[data]
train_batches = 10
[schedule]
epochs = 1
""")
    with traincoord.Run(server2.url, "no_batch_size", "w") as run:
        with pytest.raises(ValueError, match=r"has no data.batch_size: give batch_size="):
            Phases(run, sizes={"train": 40})


def test_a_job_is_completed_only_when_every_batch_was_reported(phases_server):
    with traincoord.Run(phases_server.url, "phases", "w") as run:
        phases = Phases(run, batch_size=4, sizes={"train": 40, "dev": 10})
        it = iter(phases)
        phase = next(it)
        batches = iter(phase)
        next(batches), next(batches), next(batches)  # a prefetching loader: 3 batches ahead
        phase.report(1.0)
        phase.report(2.0)  # job 1 (2 batches) is complete; job 2 has 1 of 2 reported
        phase._phases._feed.flush()
        train = run.status()["epochs"][0]
        assert (train["done"], train["samples"]) == (1, 8)
        phase.report(3.0)
        with pytest.raises(ReportError, match="no batch pending"):
            phase.report(4.0)  # the 4th batch was not handed out yet
        phases.close()


def test_unreported_batches_go_back_and_a_late_report_is_refused(phases_server, caplog):
    with traincoord.Run(phases_server.url, "phases", "w") as run:
        phases = Phases(run, batch_size=4, sizes={"train": 40, "dev": 10})
        it = iter(phases)
        phase = next(it)
        batches = iter(phase)
        next(batches), next(batches), next(batches)
        phase.report(1.0)
        phase.report(1.0)
        with caplog.at_level(logging.WARNING, logger="traincoord"):
            phases.close()  # the loop ended early: the half-reported job goes back
        assert "were not reported" in caplog.text
        with pytest.raises(ReportError, match="has ended"):
            phase.report(1.0)
        status = run.status()
        assert status["epochs"][0]["done"] == 1
        assert status["counters"]["failure_reports"] == 0
        assert status["workers"][0]["leases"] == []  # the jobs fetched ahead went back too


def test_every_epoch_is_a_phase_and_on_epoch_end_runs_once_also_without_a_job(phases_server):
    ends = []
    with traincoord.Run(phases_server.url, "phases", "slow") as slow, \
            traincoord.Run(phases_server.url, "phases", "fast") as fast:
        phases = Phases(slow, batch_size=4, sizes={"train": 40, "dev": 10},
                        on_epoch_end=lambda s, e, record: ends.append((s, e, record["samples"])))
        # `fast` trains every job of train epoch 0 before `slow` asks for one.
        for job in fast.jobs(stop_at_wait=True):
            if (job.set, job.epoch) != ("train", 0):
                fast.release([job])
                break
            job.complete(0.5, 4 * len(job.batches))
        seen = []
        for phase in phases:
            for _ in phase:
                phase.report(0.5)
            seen.append((phase.set, phase.epoch, phase.batches))
        # Train epoch 0 is a phase here too, an empty one: DDP ranks stay in step.
        assert seen[0] == ("train", 0, 0)
        assert [k[:2] for k in seen] == [(s, e) for e in range(3) for s in ("train", "dev")]
        assert ends == [(s, e, 40 if s == "train" else 10) for e in range(3)
                        for s in ("train", "dev")]


def test_a_job_that_comes_back_after_the_phase_ended_is_a_revisit(phases_server):
    with traincoord.Run(phases_server.url, "phases", "a") as a, \
            traincoord.Run(phases_server.url, "phases", "b") as b:
        held = b.next_job(wait=False)  # b holds a train job of epoch 0 ...
        phases = Phases(a, batch_size=4, sizes={"train": 40, "dev": 10})
        it = iter(phases)
        first = next(it)
        for _ in first:
            first.report(0.5)
        assert (first.set, first.epoch, first.revisit) == ("train", 0, False)
        b.release([held])  # ... and hands it back after a's phase ended
        again = next(it)
        assert (again.set, again.epoch, again.revisit) == ("train", 0, True)
        assert sum(1 for _ in again) == len(held.batches)
        phases.close()


def test_first_contact_fails_fast_with_a_clear_message(caplog):
    # Without first_contact_timeout this would retry for give_up_after (300 s by default).
    with caplog.at_level(logging.WARNING, logger="traincoord"):
        with pytest.raises(traincoord.Unreachable, match="connection refused") as refused:
            traincoord.Run("http://127.0.0.1:9", "r", first_contact_timeout=1.0)
    assert "traincoord serve" in refused.value.message
    assert "retrying" in caplog.text and "http://127.0.0.1:9" in caplog.text
    with pytest.raises(traincoord.Unreachable, match="cannot resolve host"):
        traincoord.Run("http://no-such-host.invalid:8470", "r", first_contact_timeout=1.0)


LONG_TOML = """
name = "long"
[data]
train_samples = 4
batch_size = 4
[schedule]
epochs = 150
"""


def test_a_rank_behind_by_more_epochs_than_the_status_lists_enters_and_announces_each(serve_toml):
    """The status lists the latest 100 epochs (docs/API.md): a rank that another left 150 epochs
    behind still gets every epoch as a phase, and on_epoch_end once for each, in order."""
    server = serve_toml(LONG_TOML)
    ends = []
    with traincoord.Run(server.url, "long", "slow") as slow, \
            traincoord.Run(server.url, "long", "fast") as fast:
        phases = Phases(slow, batch_size=4, sizes={"train": 4},
                        on_epoch_end=lambda s, e, record: ends.append((s, e, record["loss"])))
        for job in fast.jobs(stop_at_wait=True):
            job.complete(0.5, 4)
        status = fast.status()
        assert status["state"] == "completed"
        assert (status["epochs_total"], status["epochs_from"], len(status["epochs"])) == (150, 50, 100)
        assert [e["epoch"] for e in fast.epochs()] == list(range(150))
        assert [e["epoch"] for e in fast.epochs(120)] == list(range(120, 150))
        seen = [(phase.set, phase.epoch, phase.batches) for phase in phases]
        assert seen == [("train", e, 0) for e in range(150)]
        assert ends == [("train", e, 0.5) for e in range(150)]
