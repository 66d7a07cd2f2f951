"""The digits DDP demo, elastic (scripts/demo-elastic, shortened): two `traincoord launch` agents
of two ranks each, one rank killed (SIGKILL) mid-epoch, later a whole node's agent; the group
restarts from its checkpoint each time (the model, the optimizer and the data's cut), the second
time on one node; the run completes with every sample of every epoch in the final model exactly
once (the script counts them into its checkpoints) and the demo's accuracy."""

import json
import re
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import BINARY, REPO, Server

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

EPOCHS = 6


def status(url):
    with urllib.request.urlopen(url + "/v1/runs/digits", timeout=5) as r:
        return json.loads(r.read())


def short_digits(tmp_path):
    config = (REPO / "examples/digits/digits.toml").read_text()
    config = re.sub(r"epochs = \d+", f"epochs = {EPOCHS}", config)
    config = re.sub(r'rule = "patience"', 'rule = "none"', config)
    (tmp_path / "digits.toml").write_text(config)
    return Server(["--config", str(tmp_path / "digits.toml"), "--data-dir", str(tmp_path / "c")])


def start_agent(tmp_path, url, node, die_at_epoch):
    log = open(tmp_path / f"{node}.log", "w+")
    return (subprocess.Popen(
        [BINARY, "launch", "--url", url, "--run", "digits", "--nnodes", "1:2",
         "--nproc-per-node", "2", "--node", node, "--settle", "2", "--node-timeout", "5",
         "--grace", "5", "--max-restarts", "3", "--",
         "/usr/bin/python3", str(REPO / "examples/digits/train.py"),
         "--state", str(tmp_path / "state.pt"), "--checkpoint", str(tmp_path / "best.pt"),
         "--die-at-epoch", str(die_at_epoch)],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path), log)


def wait_for_epoch(url, agent_log, epoch, agent):
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        try:
            epochs = status(url)["epochs"]
        except OSError:  # (the coordinator restarting)
            epochs = []
        if any(e["set"] == "train" and e["epoch"] == epoch and e["closed"] for e in epochs):
            return
        assert agent.poll() is None, agent_log.read_text()
        time.sleep(0.5)
    pytest.fail(f"train epoch {epoch} did not close")


def test_a_killed_rank_and_a_killed_node_leave_every_sample_in_the_model_once(tmp_path):
    server = short_digits(tmp_path)
    agents = {}
    try:
        for node in ("node-a", "node-b"):
            agents[node] = start_agent(tmp_path, server.url, node, die_at_epoch=1)
        # Once train epoch 1 closed (after the killed rank's restart), node-b's agent dies,
        # with epochs 2 … 5 to go (in step mode an epoch of 4 ranks takes about a second).
        wait_for_epoch(server.url, tmp_path / "node-a.log", 1, agents["node-a"][0])
        agents["node-b"][0].send_signal(signal.SIGKILL)
        code = agents["node-a"][0].wait(timeout=400)
        out = (tmp_path / "node-a.log").read_text()
        assert code == 0, out
        s = status(server.url)
        assert s["state"] == "completed", s["reason"]
        # Two restarts: the killed rank's, then the lost node's; the last round on one node.
        assert s["counters"]["restores"] == 2, s["counters"]
        assert "node node-b lost" in out or "exited with" in out, out
        assert "is node rank 0 of 1 (round 3, world size 2" in out, out
        proof = f"every sample of train epochs 0..{EPOCHS - 1} in the final model exactly once: yes"
        assert proof in out, out
        dev = [e for e in s["epochs"] if e["set"] == "dev"]
        assert dev[-1]["metrics"]["accuracy"] > 0.85, dev[-1]
    finally:
        for proc, log in agents.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            log.close()
        server.kill()


def test_a_late_node_and_a_coordinator_restart_leave_every_sample_in_the_model_once(tmp_path):
    server = short_digits(tmp_path)
    agents = {}
    servers = [server]
    try:
        # node-a starts alone (MIN 1): the round forms without node-b, which comes later and
        # waits for the next re-formation.
        agents["node-a"] = start_agent(tmp_path, server.url, "node-a", die_at_epoch=2)
        wait_for_epoch(server.url, tmp_path / "node-a.log", 0, agents["node-a"][0])
        agents["node-b"] = start_agent(tmp_path, server.url, "node-b", die_at_epoch=-1)
        # The coordinator is killed -9 and comes back on its port: agents and ranks ride it out.
        server.kill()
        time.sleep(1)
        servers.append(Server(["--config", str(tmp_path / "digits.toml"), "--data-dir",
                               str(tmp_path / "c")], server.port))
        # Rank 1 (node-a's) kills itself in train epoch 2: the group re-forms, with node-b.
        code = agents["node-a"][0].wait(timeout=400)
        code_b = agents["node-b"][0].wait(timeout=60)
        out, out_b = (tmp_path / "node-a.log").read_text(), (tmp_path / "node-b.log").read_text()
        assert code == 0 and code_b == 0, out + out_b
        assert "is node rank 0 of 1 (round 1, world size 2" in out, out
        assert "is node rank 1 of 2 (round 2, world size 4" in out_b, out_b
        s = status(servers[-1].url)
        assert s["state"] == "completed", s["reason"]
        assert s["counters"]["restores"] == 1, s["counters"]
        proof = f"every sample of train epochs 0..{EPOCHS - 1} in the final model exactly once: yes"
        assert proof in out, out
    finally:
        for proc, log in agents.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            log.close()
        for s in servers:
            s.kill()
