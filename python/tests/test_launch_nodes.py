"""Several `traincoord launch` agents, each a "node" on loopback, meeting at one coordinator
(docs/LAUNCH.md): the group forms across them, a rank killed or a node agent killed restarts the
whole group with the nodes still there, a late node joins at the next re-formation, and the
agents ride out a coordinator restart."""

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import BINARY, REPO, Server

RUN = """
name = "nodes"
[data]
train_batches = 60
[schedule]
epochs = 4
[leases]
timeout = 2
max_attempts = 100
"""

# A worker: trains its jobs slowly enough for the faults to land mid-run. A file named
# kill-RANK-ROUND in the test's directory makes that rank kill itself (SIGKILL) in that round.
WORKER = """
import os, signal, sys, time
sys.path.insert(0, {python!r})
import traincoord
rank, group = os.environ["RANK"], os.environ["TRAINCOORD_GROUP"]
print("start", group, "rank", rank, "of", os.environ["WORLD_SIZE"], "node",
      os.environ["GROUP_RANK"], "of", os.environ["GROUP_WORLD_SIZE"], flush=True)
run = traincoord.Run.from_env()
for n, job in enumerate(run.jobs()):
    if n >= 2 and os.path.exists(f"kill-{{rank}}-{{group}}"):
        os.remove(f"kill-{{rank}}-{{group}}")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.1)
    job.complete(loss=0.5, samples=1)
print("done", flush=True)
"""


class Agent:
    def __init__(self, tmp_path, url, node, *extra, nnodes="1:2", nproc=2, node_timeout=4):
        self.log = open(tmp_path / f"{node}.log", "w+")
        self.proc = subprocess.Popen(
            [BINARY, "launch", "--url", url, "--run", "nodes", "--nnodes", nnodes,
             "--nproc-per-node", str(nproc), "--node", node, "--settle", "1",
             "--node-timeout", str(node_timeout), "--grace", "2", *extra, "--",
             "/usr/bin/python3", str(tmp_path / "w.py")],
            stdout=self.log, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)

    def wait(self, timeout=120):
        code = self.proc.wait(timeout=timeout)
        self.log.seek(0)
        return code, self.log.read()

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def cluster(tmp_path):
    (tmp_path / "run.toml").write_text(RUN)
    (tmp_path / "w.py").write_text(WORKER.format(python=str(REPO / "python")))
    started = {"servers": [], "agents": []}

    def serve(port=0):
        s = Server(["--config", str(tmp_path / "run.toml"), "--data-dir", str(tmp_path / "d")],
                   port)
        started["servers"].append(s)
        return s

    def agent(url, node, *extra, **kw):
        a = Agent(tmp_path, url, node, *extra, **kw)
        started["agents"].append(a)
        return a

    yield serve, agent
    for a in started["agents"]:
        a.stop()
    for s in started["servers"]:
        s.kill()


def status(url):
    with urllib.request.urlopen(url + "/v1/runs/nodes", timeout=5) as r:
        return json.loads(r.read())


def node_names(url):
    """The nodes the coordinator's rendezvous knows (none before the first join)."""
    try:
        with urllib.request.urlopen(url + "/v1/runs/nodes/nodes", timeout=5) as r:
            return [n["name"] for n in json.loads(r.read())["nodes"]]
    except urllib.error.HTTPError:
        return []


def wait_for(what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def test_two_nodes_form_one_group_and_a_killed_rank_restarts_both(cluster, tmp_path):
    serve, agent = cluster
    server = serve()
    (tmp_path / "kill-3-rdzv-r1").touch()  # rank 3 (node 1's second) dies in round 1
    a = agent(server.url, "na", "--max-restarts", "2")
    # Node ranks follow the order nodes first joined: na joins first, so nb is node 1 and
    # holds rank 3.
    wait_for(lambda: "na" in node_names(server.url))
    b = agent(server.url, "nb", "--max-restarts", "2")
    (code_a, out_a), (code_b, out_b) = a.wait(), b.wait()
    assert code_a == 0 and code_b == 0, out_a + out_b
    both = out_a + out_b
    # Round 1: four ranks over two nodes, numbered 0..3 (node na's may be stopped before they
    # print); rank 3 dies; round 2 has both nodes again.
    assert "node na is node rank 0 of 2 (round 1" in out_a or "round 1" not in out_a, out_a
    assert "node nb is node rank 1 of 2 (round 1, world size 4" in out_b, out_b
    assert "start rdzv-r1 rank 3 of 4" in out_b, out_b
    for rank in range(4):
        assert f"start rdzv-r2 rank {rank} of 4" in both, both
    assert "worker rank3 exited with 137" in out_b
    assert "restarting the group (1 of 2)" in out_b
    assert status(server.url)["state"] == "completed"


def test_a_lost_node_leaves_the_others_to_go_on_and_a_late_node_joins_later(cluster, tmp_path):
    serve, agent = cluster
    server = serve()
    a = agent(server.url, "na", "--max-restarts", "3")
    b = agent(server.url, "nb", "--max-restarts", "3")
    wait_for(lambda: "start rdzv-r1" in a.output() and "start rdzv-r1" in b.output())
    b.proc.send_signal(signal.SIGKILL)  # the agent dies; its ranks die with it (PDEATHSIG)
    wait_for(lambda: "start rdzv-r2 rank 1 of 2" in a.output(), timeout=60)
    assert "node nb lost" in a.output()
    # A node that comes back joins at the next re-formation: make one by killing a rank of na.
    late = agent(server.url, "nc", "--max-restarts", "3")
    # It waits, and says so: round 2 runs without it.
    wait_for(lambda: "node nc joins when it re-forms" in late.output())
    assert "start" not in late.output()
    (tmp_path / "kill-0-rdzv-r2").touch()
    code_a, out_a = a.wait()
    code_c, out_c = late.wait()
    assert code_a == 0 and code_c == 0, out_a + out_c
    assert "start rdzv-r3 rank" in out_c and "of 4" in out_c, out_c
    assert status(server.url)["state"] == "completed"


def test_the_agents_ride_out_a_coordinator_restart(cluster, tmp_path):
    serve, agent = cluster
    server = serve()
    a = agent(server.url, "na", nnodes="1", node_timeout=30)
    wait_for(lambda: "start rdzv-r1" in a.output())
    server.kill()  # kill -9 under the agent; its ranks retry, its polls fail meanwhile
    time.sleep(1)
    again = serve(server.port)
    code, out = a.wait()
    assert code == 0, out
    assert status(again.url)["state"] == "completed"
    assert "start rdzv-r2" not in out  # the group ran on: a restart of the coordinator is no failure
