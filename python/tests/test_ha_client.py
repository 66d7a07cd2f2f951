"""The Python client and `traincoord launch` against several coordinators (docs/PYTHON.md,
"Several coordinators"): tests/hostile/fake_ha.py puts a proxy per coordinator url in front of
one real `traincoord serve`, each playing the leader, a standby (421 not_leader), a deposed
leader answering with an older term, or one that is down, and losing replies on demand."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import traincoord
from conftest import BINARY, REPO

FAKE = REPO / "tests" / "hostile" / "fake_ha.py"

RUN = """
name = "py"
[data]
train_batches = 24
dev_batches = 6
order = "shuffled"
seed = 5
[schedule]
epochs = 2
iters_per_worker = 2
[leases]
timeout = 2
"""


class FakeHa:
    """The fake coordinators in front of `upstream`, killed by their pid by the fixture."""

    def __init__(self, upstream, count=2):
        self.proc = subprocess.Popen(["/usr/bin/python3", str(FAKE), upstream, "--count",
                                      str(count)], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("ports "):
            self.kill()
            raise RuntimeError(f"fake_ha.py did not start: {line!r}")
        self.urls = [f"http://127.0.0.1:{p}" for p in line.split()[1:]]

    def set(self, i, **settings):
        request = urllib.request.Request(self.urls[i] + "/__fake_ha",
                                         data=json.dumps(settings).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=5) as r:
            return json.loads(r.read())

    def stats(self, i):
        with urllib.request.urlopen(self.urls[i] + "/__fake_ha", timeout=5) as r:
            return json.loads(r.read())

    def requests(self, i, mode, path):
        return sum(1 for r in self.stats(i)["requests"]
                   if r.startswith(mode + " ") and path in r)

    def lead(self, i, term):
        """Coordinator i leads (term), the others are its standbys."""
        self.set(i, mode="leader", term=term)
        for other in range(len(self.urls)):
            if other != i:
                self.set(other, mode="standby", leader=self.urls[i], leader_term=term)

    def both(self):
        return ",".join(self.urls)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def ha(serve_toml):
    server = serve_toml(RUN)
    fake = FakeHa(server.url)
    fake.server = server
    try:
        yield fake
    finally:
        fake.kill()


def status(fake):
    with urllib.request.urlopen(fake.server.url + "/v1/runs/py?epochs=0", timeout=5) as r:
        return json.loads(r.read())


def expect_every_job_counted_once(fake):
    s = status(fake)
    assert s["state"] == "completed"
    planned = s["progress"]["jobs_planned"]
    assert s["progress"]["jobs_done"] == planned
    assert s["counters"]["completions_accepted"] == planned


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_worker_given_a_standby_first_finds_the_leader(ha):
    ha.lead(1, term=4)
    run = traincoord.Run(ha.both(), "py", "w0", give_up_after=20)
    for job in run.jobs():
        job.complete(loss=0.5, samples=1)
    assert run.finished.state == "completed"
    assert run.leader == ha.urls[1]
    assert ha.requests(0, "standby", "/workers") == 1  # asked the standby first, once
    assert ha.requests(0, "standby", "/acquire") == 0
    expect_every_job_counted_once(ha)


def test_the_leader_a_standby_names_is_followed_even_when_not_listed(ha):
    third = FakeHa(ha.server.url, 1)  # leads; not in the worker's list
    try:
        third.set(0, mode="leader", term=6)
        ha.set(0, mode="standby", leader=third.urls[0], leader_term=6)
        ha.set(1, mode="down")
        run = traincoord.Run(ha.both(), "py", "w0", heartbeats=False, give_up_after=20)
        assert run.next_job() is not None
        assert run.leader == third.urls[0]
        assert ha.stats(1)["refused"] == 0  # went to the leader named, not round the list
    finally:
        third.kill()


def test_leadership_moves_mid_run_and_every_job_is_counted_once(ha):
    ha.lead(0, term=7)
    errors = []

    def grouped():  # a second worker: several jobs per request, with its heartbeats
        try:
            other = traincoord.Run([ha.urls[0], ha.urls[1]], "py", "grouped",
                                   jobs_per_request=3, give_up_after=20)
            for job in other.jobs(prefetch=2):
                time.sleep(0.02)
                job.complete(loss=0.5, samples=1)
            other.close()
        except Exception as e:  # raised in the test below
            errors.append(e)

    thread = threading.Thread(target=grouped)
    thread.start()
    run = traincoord.Run(ha.both(), "py", "w0", give_up_after=20)
    for n, job in enumerate(run.jobs(), 1):
        if n == 4:
            ha.lead(1, term=8)
            time.sleep(1.5)  # heartbeats (every 2 / 3 s) reach the new leader
        elif n == 10:
            ha.lead(0, term=9)
        time.sleep(0.02)
        job.complete(loss=0.5, samples=1)
    thread.join(timeout=120)
    assert not errors, errors
    assert run.finished.state == "completed"
    assert ha.requests(1, "leader", "/complete") >= 1
    assert ha.requests(1, "leader", "/heartbeat") >= 1
    expect_every_job_counted_once(ha)


def test_heartbeats_alone_follow_the_leader(ha):
    ha.lead(0, term=2)
    run = traincoord.Run(ha.both(), "py", "w0", give_up_after=20)
    job = run.next_job()  # held: heartbeated, and nothing else sent
    ha.lead(1, term=3)
    for _ in range(100):
        if ha.requests(1, "leader", "/heartbeat"):
            break
        time.sleep(0.05)
    assert ha.requests(0, "standby", "/heartbeat") >= 1  # told where the leader is
    assert ha.requests(1, "leader", "/heartbeat") >= 1
    assert run.leader == ha.urls[1]
    job.complete(loss=0.5, samples=1)
    assert job.outcome == "accepted"


def test_a_completion_whose_reply_was_lost_is_answered_duplicate_by_the_new_leader(ha):
    ha.lead(0, term=3)
    run = traincoord.Run(ha.both(), "py", "w0", heartbeats=False, give_up_after=20)
    job = run.next_job()
    ha.set(1, mode="leader", term=4)
    # Coordinator 0 (deposed, not knowing it yet) forwards the completion (counted), loses the
    # reply, and is down from then on.
    ha.set(0, drop_reply={"path": "/complete", "count": 1, "then": {"mode": "down"}})
    job.complete(loss=0.5, samples=1)
    assert ha.stats(0)["dropped_replies"] == 1
    assert job.outcome == "duplicate"
    assert ha.requests(1, "leader", "/complete") == 1
    counters = status(ha)["counters"]
    assert (counters["completions_accepted"], counters["completions_duplicate"]) == (1, 1)
    for job in run.jobs():
        job.complete(loss=0.5, samples=1)
    expect_every_job_counted_once(ha)


def test_an_answer_of_an_older_term_is_ignored(ha):
    ha.set(0, mode="leader", term=5)
    ha.set(1, mode="stale", term=3)
    run = traincoord.Run(ha.both(), "py", "w0", heartbeats=False)  # term 5 seen
    # (twice: the client tries a kept-alive connection that was closed once more at once)
    ha.set(0, refuse={"path": "/acquire", "count": 2})
    job = run.next_job()  # refused at 0, a stale "finished" at 1, then 0 again
    assert job is not None, run.finished
    assert run.finished is None
    assert ha.stats(1)["stale"] == 1
    assert ha.stats(0)["refused"] == 2


def test_a_single_url_behaves_as_before(ha):
    run = traincoord.Run(ha.server.url, "py", "w0")
    assert (run.url, run.urls) == (ha.server.url, [ha.server.url])
    for job in run.jobs():
        job.complete(loss=0.5, samples=1)
    expect_every_job_counted_once(ha)
    gone = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(traincoord.Unreachable) as e:
        traincoord.Run(gone, "py", "w1", first_contact_timeout=0.5)
    assert e.value.code == "unreachable"
    assert e.value.message.startswith(f"cannot reach the coordinator at {gone} (connection "
                                      "refused")


def test_with_every_coordinator_down_it_gives_up_naming_each_url(ha):
    a, b = (f"http://127.0.0.1:{closed_port()}" for _ in range(2))
    with pytest.raises(traincoord.Unreachable) as e:
        traincoord.Run([a, b], "py", "w0", first_contact_timeout=0.5)
    assert e.value.code == "unreachable"
    assert f"{a}: connection refused" in e.value.message
    assert f"{b}: connection refused" in e.value.message
    # Once reached, give_up_after applies: both coordinators go down.
    ha.lead(0, term=2)
    run = traincoord.Run(ha.both(), "py", "w1", heartbeats=False, give_up_after=0.8)
    ha.set(0, mode="down")
    ha.set(1, mode="down")
    with pytest.raises(traincoord.Unreachable) as e:
        run.next_job()
    assert e.value.code == "unreachable"
    assert "for 1 s; giving up" in e.value.message or "for 0 s; giving up" in e.value.message
    assert f"{ha.urls[0]}: " in e.value.message and f"{ha.urls[1]}: " in e.value.message


def test_during_an_election_the_worker_waits_for_the_new_leader(ha):
    for i in range(2):
        ha.set(i, mode="standby", leader=None, retry_after_ms=30)

    def elect():
        for _ in range(400):
            if ha.stats(1)["not_leader"] >= 3:
                break
            time.sleep(0.01)
        ha.lead(1, term=2)

    thread = threading.Thread(target=elect)
    thread.start()
    run = traincoord.Run(ha.both(), "py", "w0", heartbeats=False, give_up_after=20)
    thread.join()
    assert run.next_job() is not None
    assert run.leader == ha.urls[1]


def test_from_env_takes_several_urls_separated_by_commas(ha, monkeypatch):
    ha.lead(1, term=2)
    monkeypatch.setenv("TRAINCOORD_URL", f" {ha.urls[0]}/, {ha.urls[1]}")
    monkeypatch.setenv("TRAINCOORD_RUN", "py")
    run = traincoord.Run.from_env(heartbeats=False)
    assert run.urls == ha.urls
    assert run.next_job() is not None
    assert run.leader == ha.urls[1]
    with pytest.raises(traincoord.CoordinatorError) as e:
        traincoord.Run(f"{ha.urls[0]},ftp://x:1", "py")
    assert (e.value.code, e.value.field) == ("invalid_argument", "url")


WORKER = """
import sys, time
sys.path.insert(0, {python!r})
import traincoord
run = traincoord.Run.from_env(give_up_after=30)
for job in run.jobs():
    time.sleep(0.05)
    job.complete(loss=0.5, samples=1)
print("done", run.url, flush=True)
"""


def test_launch_takes_the_list_and_its_ranks_follow_the_leader(ha, tmp_path):
    ha.lead(1, term=2)
    (tmp_path / "w.py").write_text(WORKER.format(python=str(REPO / "python")))
    log = open(tmp_path / "launch.log", "w+")
    agent = subprocess.Popen(
        [BINARY, "launch", "--url", ha.both(), "--run", "py", "--nnodes", "1",
         "--nproc-per-node", "2", "--settle", "0", "--", "/usr/bin/python3",
         str(tmp_path / "w.py")], stdout=log, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        for _ in range(600):  # the leadership moves once the ranks train
            if status(ha)["progress"]["jobs_done"] >= 4 or agent.poll() is not None:
                break
            time.sleep(0.05)
        ha.lead(0, term=3)
        code = agent.wait(timeout=120)
    finally:
        if agent.poll() is None:  # SIGTERM first: the agent passes it on to its ranks
            agent.terminate()
            try:
                agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(timeout=10)
    log.seek(0)
    output = log.read()
    log.close()
    assert code == 0, output
    assert output.count(f"done {ha.both()}") == 2, output
    assert ha.requests(0, "standby", "/nodes/join") >= 1
    assert ha.requests(0, "leader", "/complete") >= 1
    expect_every_job_counted_once(ha)


def snippet(doc, heading):
    """The first ```python block after `heading` in docs/DOC."""
    text = (REPO / "docs" / doc).read_text()
    after = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_docs_snippet_runs_as_printed(ha):
    ha.lead(1, term=2)
    code = snippet("PYTHON.md", "### Several coordinators")
    assert "http://10.0.0.1:8470,http://10.0.0.2:8470" in code
    code = code.replace("http://10.0.0.1:8470", ha.urls[0])
    code = code.replace("http://10.0.0.2:8470", ha.urls[1]).replace('"digits"', '"py"')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "python")})
    assert out.returncode == 0, out.stderr
    assert f"led by {ha.urls[1]}" in out.stdout, out.stdout
    expect_every_job_counted_once(ha)
