"""Step mode (docs/PYTHON.md "DDP: copy this loop", docs/SEMANTICS.md "Step mode"): the loops of
README.md and the docs, without join(), run as printed on 2 and 3 DDP ranks (gloo, real DataLoaders with 2
loader workers) finishes every epoch with every sample trained once; the loss scale makes the
ranks' averaged gradient the one of a single process over the step's samples; a rank without
its rank is refused."""

import json
import re
import time
import urllib.request

import pytest

import traincoord
import traincoord.torch
from test_ddp_snippet import EPILOGUE, PRELUDE, REPO, RUN_LINE, run_ranks, snippet


def readme_snippet():
    """README.md's first ```python block (its "Use" section)."""
    text = (REPO / "README.md").read_text()
    return text[text.index("```python\n") + 10:text.index("```", text.index("```python\n") + 10)]

# 404 train samples in batches of 32 (13 batches): for 2 ranks 7 steps, the last short; for 3
# ranks 5 steps, the last splitting 20 samples 7/7/6. 70 dev samples.
STEPS_TOML = """
name = "steps"
[data]
train_samples = 404
dev_samples = 70
batch_size = 32
seed = 11
[schedule]
mode = "steps"
epochs = 3
validation_every = 1
[leases]
timeout = 5.0
"""


# README.md's loop on 2 ranks of a run that leaves schedule.mode to its default ("auto": steps
# for a group), docs/PYTHON.md's on 3 ranks of a run in mode "steps".
@pytest.mark.parametrize("ranks,doc", [(2, "README"), (3, "PYTHON")])
def test_the_step_mode_loop_of_the_docs_trains_every_sample_once_without_join(
        serve_toml, tmp_path, ranks, doc):
    if doc == "README":
        code = readme_snippet()
        prelude = PRELUDE.replace(RUN_LINE, "")  # (the snippet makes its own)
        toml = STEPS_TOML.replace('mode = "steps"\n', "")
    else:
        code = snippet("PYTHON.md", "### DDP: copy this loop")
        prelude, toml = PRELUDE, STEPS_TOML
    assert "join(" not in code and "phase.loss_scale" in code
    server = serve_toml(toml)
    finished, outputs, seen = run_ranks(server, prelude + code + EPILOGUE, tmp_path,
                                        timeout=150, ranks=ranks, run="steps")
    assert finished, "\n---\n".join(outputs)
    assert not any("hands out jobs" in out for out in outputs), outputs
    trained = sorted(sum(seen, []))
    assert trained == sorted(list(range(404)) * 3), [len(s) for s in seen]
    # Every rank trained the same number of batches (steps) in every epoch: 3 epochs of
    # ceil(404 / (32 * ranks)) steps.
    steps = -(-404 // (32 * ranks))
    with urllib.request.urlopen(f"{server.url}/v1/runs/steps", timeout=20) as reply:
        status = json.load(reply)
    assert status["state"] == "completed", status["state"]
    assert status["mode"] == "steps" and status["config"]["mode"] == doc.replace(
        "README", "auto").replace("PYTHON", "steps")
    train = [e for e in status["epochs"] if e["set"] == "train"]
    assert [e["done"] for e in train] == [steps * ranks] * 3


def test_the_loss_scale_gives_the_gradient_of_one_process_over_the_step(serve_toml):
    """The last step of 404 samples over 3 ranks splits 20 samples 7/7/6: each rank's gradient
    of its batch's mean loss times loss_scale, averaged over the ranks as DDP does, is the
    gradient of the mean loss over the step's 20 samples."""
    torch = pytest.importorskip("torch")
    server = serve_toml(STEPS_TOML)
    runs = []
    for rank in range(3):
        run = traincoord.Run(server.url, "steps", worker=f"r{rank}", group="g1")
        run.set_rank(rank, 3)
        runs.append(run)
    try:
        last = []
        for rank, run in enumerate(runs):
            jobs = [run.next_job() for _ in range(5)]
            assert [j.step for j in jobs] == [0, 1, 2, 3, 4] and {j.steps for j in jobs} == {5}
            assert all(j.rank == rank and j.batches == [] for j in jobs)
            last.append(jobs[-1])
        sizes = [len(j.samples) for j in last]
        assert sorted(sizes) == [6, 7, 7], sizes
        assert sum(j.loss_scale for j in last) == pytest.approx(3.0)

        torch.manual_seed(0)
        xs = torch.randn(404, 4, dtype=torch.float64)
        ys = torch.randn(404, 1, dtype=torch.float64)
        model = torch.nn.Linear(4, 1).double()

        def grad(loss):
            model.zero_grad()
            loss.backward()
            return torch.cat([p.grad.flatten().clone() for p in model.parameters()])

        mse = torch.nn.MSELoss()
        per_rank = [grad(mse(model(xs[j.samples]), ys[j.samples]) * j.loss_scale) for j in last]
        ddp = sum(per_rank) / 3  # DDP averages the ranks' gradients
        everything = sum((j.samples for j in last), [])
        reference = grad(mse(model(xs[everything]), ys[everything]))
        assert torch.allclose(ddp, reference, rtol=1e-12, atol=1e-12), (ddp, reference)
        # Without the scale the average is off (the 6-sample batch counts as much as a 7).
        plain = sum(grad(mse(model(xs[j.samples]), ys[j.samples])) for j in last) / 3
        assert not torch.allclose(plain, reference, rtol=1e-9, atol=1e-9)
    finally:
        for run in runs:
            run.close()


def test_a_worker_without_its_rank_is_refused_and_told_how(serve_toml):
    server = serve_toml(STEPS_TOML)
    run = traincoord.Run(server.url, "steps", worker="alone")
    try:
        with pytest.raises(traincoord.CoordinatorError) as refused:
            run.next_job(wait=False)
        assert refused.value.code == "rank_required"
        assert "rank" in str(refused.value) and "world_size" in str(refused.value)
        run.set_group("g1")
        run.set_rank(0, 2)
        other = traincoord.Run(server.url, "steps", worker="other", group="g1")
        try:
            with pytest.raises(traincoord.CoordinatorError) as mismatch:
                other.set_rank(1, 3)
            assert mismatch.value.code == "world_size_mismatch"
        finally:
            other.close()
        assert run.next_job().rank == 0
    finally:
        run.close()


# 202 train samples in batches of 4 (51 batches), 30 dev samples (8 batches): a rank of a
# group of one, handed every batch of every step.
FETCH_TOML = """
name = "fetch"
[data]
train_samples = 202
dev_samples = 30
batch_size = 4
seed = 7
[schedule]
mode = "steps"
epochs = 2
validation_every = 1
[leases]
timeout = 5.0
"""


def _round_trips(url):
    """The acquire and complete requests the coordinator answered, from GET /metrics."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    counts = re.findall(r'^traincoord_http_requests_total\{endpoint="(acquire|complete)",'
                        r'status="\d+"\} (\d+)$', text, re.M)
    return sum(int(n) for _, n in counts)


def _train(phases, seen, stop_after=None, cut_after=None, step_s=0.0):
    """Iterates the phases as a loop without a DataLoader would: every batch yielded is
    recorded in seen[(set, epoch)] and reported. cut_after: calls state_dict() after that many
    batches (returned); stop_after: leaves the loop after that many (without reporting it);
    step_s: a pause per batch (as a step's work would make), so that the feed's thread acts
    between two reports."""
    done, cut = 0, None
    for phase in phases:
        for samples in phase:
            if done == stop_after:
                phases.close()
                return cut
            seen.setdefault((phase.set, phase.epoch), []).extend(samples)
            time.sleep(step_s)
            phase.report(0.5)
            done += 1
            if done == cut_after:
                cut = phases.state_dict()
    return cut


def test_a_rank_fetches_several_steps_per_round_trip_and_trains_each_sample_once(serve_toml):
    """Step mode batches its requests: the batches of several steps per acquire, several
    reports per complete (counted by the coordinator, not timed), every sample of every epoch
    once."""
    server = serve_toml(FETCH_TOML)
    with traincoord.Run(server.url, "fetch", worker="r0", group="g1") as run:
        before = _round_trips(server.url)
        phases = traincoord.torch.Phases(run)
        seen = {}
        _train(phases, seen, step_s=0.002)
        assert run.finished is not None and run.finished.state == "completed"
    for epoch in range(2):
        assert sorted(seen[("train", epoch)]) == list(range(202))
        assert sorted(seen[("dev", epoch)]) == list(range(30))
    batches = 2 * (51 + 8)
    trips = _round_trips(server.url) - before
    # About one round trip per STEPS_PER_REQUEST (8) steps, one or two at each phase's end
    # (its last reports with the ask for the next epoch's batches): 20-21 when measured; the
    # feed's shape of job mode (a prefetch of 4 in groups of 2) made 65, and a feed that asks
    # again with every report once the rank's batches of the epoch are all handed out (its
    # last steps) 49.
    assert trips <= batches // 4, (trips, batches)


def test_batches_fetched_ahead_and_reports_queued_do_not_break_a_cut(serve_toml):
    """A rank holding its next steps (and up to a group of reports not sent yet) calls
    state_dict mid-epoch: the cut holds exactly the batches reported before it; a group
    restarting from it trains the rest, so that every sample of every epoch is trained once in
    the lineage of the cut (the 5 batches trained after the cut are not in it)."""
    server = serve_toml(FETCH_TOML)
    before, after = {}, {}
    with traincoord.Run(server.url, "fetch", worker="a", group="g1") as run:
        phases = traincoord.torch.Phases(run)
        cut = _train(phases, before, cut_after=21, stop_after=26)
    assert cut is not None
    trained_before_cut = before[("train", 0)][:21 * 4]
    with traincoord.Run(server.url, "fetch", worker="b", group="g2") as run:
        phases = traincoord.torch.Phases(run)
        phases.load_state_dict(cut)
        _train(phases, after)
        assert run.finished is not None and run.finished.state == "completed"
    assert sorted(trained_before_cut + after[("train", 0)]) == list(range(202))
    assert sorted(after[("dev", 0)]) == list(range(30))
    assert sorted(after[("train", 1)]) == list(range(202))
