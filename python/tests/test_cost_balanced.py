"""Cost-balanced step mode end to end (docs/PYTHON.md "Cost-balanced batches in step mode",
docs/CONFIG.md "Cost-balanced steps", docs/SEMANTICS.md "Cost-balanced step mode"): the config
of the docs, with its lengths files, served by the real binary; the loop of the docs run as
printed on 2 DDP ranks (gloo, DataLoaders with 2 loader workers) trains every sample once per
epoch in lockstep, its reports carry the batches' times, and status shows the fitted model and
the epochs planned with it. A restart from the data dir needs no lengths file."""

import json
import random
import re
import shutil
import urllib.error
import urllib.request

import pytest

from conftest import Server
from test_ddp_snippet import REPO, run_ranks, snippet

# What the snippet needs before it: 300 + 40 samples whose "training" takes a time proportional
# to the padded batch (n * longest length), rank 1 twice as long, as a variable-length model's.
PRELUDE = """
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
import traincoord, traincoord.torch

LENGTHS = [float(v) for v in open(os.environ["LENGTHS_FILE"]).read().split()]

class Ids(Dataset):
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __getitem__(self, i):
        if not 0 <= i < self.n: raise IndexError(i)
        return torch.tensor([float(i)]), torch.tensor([0.0])

class Recording(torch.nn.Module):  # notes the samples it trains on; sleeps like a padded batch
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.seen = []
    def forward(self, x):
        ids = [int(v) for v in x[:, 0].tolist()]
        if self.training and torch.is_grad_enabled():
            self.seen.extend(ids)
            padded = len(ids) * max(LENGTHS[i] for i in ids)
            time.sleep(0.00003 * padded * (1 + dist.get_rank()))
        return self.lin(x)

torch.set_num_threads(1)
dist.init_process_group("gloo")
run = traincoord.Run.from_env(long_poll=5, first_contact_timeout=20)
train_set, dev_set = Ids(300), Ids(40)
net = Recording()
model = torch.nn.parallel.DistributedDataParallel(net)
optim = torch.optim.SGD(model.parameters(), lr=1e-4)
loss_fn = torch.nn.MSELoss()
"""

EPILOGUE = """
with open(os.environ["SEEN_FILE"], "w") as f:
    json.dump(net.seen, f)
run.close()
"""


def toml_of_docs():
    text = (REPO / "docs" / "CONFIG.md").read_text()
    after = text[text.index("### Cost-balanced steps"):]
    return re.search(r"```toml\n(.*?)```", after, re.S).group(1)


def write_lengths(folder):
    """Speech-like lengths (1 to 30, skewed short), seeded."""
    rng = random.Random(4)
    (folder / "lengths").mkdir(exist_ok=True)
    train = [round(1 + 29 * rng.random() ** 3, 2) for _ in range(300)]
    dev = [round(1 + 29 * rng.random() ** 3, 2) for _ in range(40)]
    (folder / "lengths" / "train.txt").write_text("".join(f"{v}\n" for v in train))
    (folder / "lengths" / "dev.txt").write_text("".join(f"{v}\n" for v in dev))
    return train


def status_of(server, run="speech"):
    with urllib.request.urlopen(f"{server.url}/v1/runs/{run}", timeout=20) as reply:
        return json.load(reply)


def test_the_cost_balanced_loop_of_the_docs_trains_every_sample_once_and_fits_the_model(
        tmp_path, monkeypatch):
    code = snippet("PYTHON.md", "### Cost-balanced batches in step mode")
    assert "batch_size=None" in code and "seconds=" in code and "join(" not in code
    write_lengths(tmp_path)
    config = tmp_path / "run.toml"
    config.write_text(toml_of_docs())
    monkeypatch.setenv("LENGTHS_FILE", str(tmp_path / "lengths" / "train.txt"))
    data_dir = tmp_path / "data"
    server = Server(["--config", str(config), "--data-dir", str(data_dir)])
    try:
        finished, outputs, seen = run_ranks(server, PRELUDE + code + EPILOGUE, tmp_path,
                                            timeout=200, ranks=2, run="speech")
        assert finished, "\n---\n".join(outputs)
        assert sorted(sum(seen, [])) == sorted(list(range(300)) * 3), [len(s) for s in seen]
        status = status_of(server)
        assert status["state"] == "completed", status["state"]
        assert status["config"]["batch_budget"] == 120
        assert status["config"]["lengths"]["train"]["count"] == 300
        model = status["cost_model"]
        assert model["fitted"] and model["reports"] >= 8 and len(model["speeds"]) == 2, model
        train = [e for e in status["epochs"] if e["set"] == "train"]
        assert len(train) == 3
        for e in train:  # lockstep: every rank the same number of steps
            assert e["ranks"] == 2 and e["done"] == 2 * e["steps"], e
        # Epoch 0 was planned with the declared cost (no speeds), and the steps no rank had
        # begun once the model had every rank's speed re-planned with it (the warm-up re-plan:
        # then a speed per rank; a prefetch deep enough may have begun them all); the later
        # ones with the fitted model from the start, frozen (a speed per rank).
        # Until then each rank sent every report at once and its feed held at most 2 steps
        # (the coordinator's `warming_up`), so the re-plan came before the epoch's 13 steps
        # were all begun: the model needs 4 (8 reports, 3 of each rank), and each rank holds
        # the DataLoader's 4 batches (2 workers, prefetch_factor 2) and the feed's 2 beyond
        # its last report. (Before `warming_up` the feed held 8-16: epoch 0 was never
        # re-planned.)
        print("epoch 0:", train[0]["steps"], "steps, re-planned after",
              train[0]["planned_with"].get("replanned_after"))
        assert len(train[0]["planned_with"]["speeds"]) == 2, train[0]
        assert 4 <= train[0]["planned_with"]["replanned_after"] < train[0]["steps"], train[0]
        assert all(len(e["planned_with"]["speeds"]) == 2 for e in train[1:]), train
        checksum = status["config"]["lengths"]["train"]["xxh3"]
    finally:
        server.kill()
    # A restart from the data dir needs no lengths file: they were stored with the run.
    shutil.rmtree(tmp_path / "lengths")
    (tmp_path / "lengths").mkdir()
    restarted = Server(["--data-dir", str(data_dir)])
    try:
        again = status_of(restarted)
        assert again["config"]["lengths"]["train"]["xxh3"] == checksum
        assert again["cost_model"] == status["cost_model"]
        assert [(e["steps"], e["done"], e["planned_with"]) for e in again["epochs"]] == [
            (e["steps"], e["done"], e["planned_with"]) for e in status["epochs"]]
    finally:
        restarted.kill()


def test_a_completion_with_a_bad_time_is_refused_naming_seconds(tmp_path):
    pytest.importorskip("torch")
    import traincoord
    write_lengths(tmp_path)
    config = tmp_path / "run.toml"
    config.write_text(toml_of_docs())
    server = Server(["--config", str(config), "--in-memory"])
    run = traincoord.Run(server.url, "speech", worker="r0", group="g1")
    try:
        run.set_rank(0, 1)
        job = run.next_job()
        assert job.samples and job.loss_scale == pytest.approx(1.0)
        body = json.dumps({"worker": run.id, "lease": job.lease, "loss": 1.0,
                           "seconds": -1}).encode()
        request = urllib.request.Request(f"{server.url}/v1/runs/speech/complete", data=body,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=20)
        assert refused.value.code == 400
        reply = json.loads(refused.value.read())
        assert reply["error"]["field"] == "seconds", reply
    finally:
        run.close()
        server.kill()
