"""The Python client against the real coordinator."""

import collections
import math
import subprocess
import sys
import threading
import time

import pytest

import traincoord
from conftest import REPO


def work(url, name, ledger, lock, **kwargs):
    run = traincoord.Run(url, "py", name, long_poll=2, **kwargs)
    with run:
        for job in run.jobs():
            job.complete(loss=0.1 * (job.epoch + 1), samples=len(job.batches))
            if job.outcome in (None, "accepted", "duplicate"):
                with lock:
                    ledger[(job.set, job.epoch)].extend(job.batches)
    return run.finished


def check_exactly_once(ledger):
    for epoch in range(3):
        assert sorted(ledger[("train", epoch)]) == list(range(24)), epoch
        assert sorted(ledger[("dev", epoch)]) == list(range(6)), epoch


def run_three_workers(url, prefix, **kwargs):
    """Three workers train the run to its end; returns how each saw it end and the ledger."""
    ledger, lock, ends = collections.defaultdict(list), threading.Lock(), []
    threads = [threading.Thread(target=lambda i=i: ends.append(
        work(url, f"{prefix}{i}", ledger, lock, **kwargs))) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ends, ledger


def test_workers_finish_the_run_with_every_batch_trained_once(server):
    ends, ledger = run_three_workers(server.url, "t")
    assert [e.state for e in ends] == ["completed"] * 3
    check_exactly_once(ledger)
    status = traincoord.Run(server.url, "py", "observer", heartbeats=False).status()
    assert status["state"] == "completed"
    assert math.isclose(status["epochs"][0]["loss"], 0.1)


def test_the_series_hold_every_completions_loss_for_the_whole_run(server):
    """Run.series(): the loss of every counted completion per set, numbered in counting
    order, after its epoch closed; `after` gives only the newer points."""
    ends, _ = run_three_workers(server.url, "s")
    assert [e.state for e in ends] == ["completed"] * 3
    with traincoord.Run(server.url, "py", "observer", heartbeats=False) as run:
        series = run.series()
        train, dev = series[("train", "loss")], series[("dev", "loss")]
        assert len(train) == 3 * 12 and len(dev) == 3 * 3  # (2 batches a job)
        assert sorted(p[0] for p in train + dev) == list(range(1, 3 * 15 + 1))
        assert all(math.isclose(value, 0.1 * (epoch + 1)) for _, epoch, value in train + dev)
        assert run.series(after=40) == {key: [p for p in points if p[0] > 40]
                                        for key, points in series.items()}


def test_workers_taking_several_jobs_per_request_train_every_batch_once(server):
    ends, ledger = run_three_workers(server.url, "g", jobs_per_request=3)
    assert [e.state for e in ends] == ["completed"] * 3
    check_exactly_once(ledger)
    status = traincoord.Run(server.url, "py", "observer", heartbeats=False).status()
    # 3 epochs of 12 train and 3 dev jobs (2 batches a job), each counted once
    assert status["counters"]["completions_accepted"] == 3 * (12 + 3)
    assert math.isclose(status["epochs"][0]["loss"], 0.1)


def test_a_failed_job_in_a_group_is_retried_and_the_rest_counted(server):
    run = traincoord.Run(server.url, "py", "groups", heartbeats=False, jobs_per_request=2)
    seen = []
    for job in run.jobs():
        seen.append((job.set, job.epoch, job.index, job.attempt))
        if len(seen) == 2:
            job.fail("out of memory")
        else:
            job.complete(loss=0.5, samples=1)
        if len(seen) == 5:
            break
    assert seen[1][3] == 1
    assert (seen[1][0], seen[1][1], seen[1][2], 2) in seen[2:]  # handed out again
    with pytest.raises(traincoord.CoordinatorError) as e:
        traincoord.Run(server.url, "py", "x", heartbeats=False, jobs_per_request=65)
    assert e.value.field == "jobs_per_request"


def test_a_job_that_raises_is_given_back_and_retried(server):
    run = traincoord.Run(server.url, "py", "clumsy", heartbeats=False)
    job = run.next_job()
    with pytest.raises(ZeroDivisionError):
        with job:
            1 / 0
    again = run.next_job()
    assert (again.index, again.attempt) == (job.index, 2)


def test_bad_input_is_a_clear_error_naming_the_field(server):
    run = traincoord.Run(server.url, "py", "typo", heartbeats=False)
    job = run.next_job()
    with pytest.raises(traincoord.CoordinatorError) as e:
        job.complete(loss=1.0, samples=-3)
    assert e.value.status == 400 and e.value.field == "samples"
    with pytest.raises(traincoord.CoordinatorError) as e:
        traincoord.Run(server.url, "nope", "x")
    assert e.value.status == 404 and "no run named nope" in e.value.message


def test_a_non_finite_loss_is_reported_not_averaged(server):
    run = traincoord.Run(server.url, "py", "nan", heartbeats=False)
    job = run.next_job()
    job.complete(loss=float("nan"), samples=2)
    assert job.outcome == "accepted"
    assert run.status()["counters"]["nonfinite_losses"] == 1


def test_a_coordinator_restart_mid_run_loses_nothing(server):
    ledger, lock, ends = collections.defaultdict(list), threading.Lock(), []
    threads = [threading.Thread(target=lambda i=i: ends.append(
        work(server.url, f"r{i}", ledger, lock))) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    server.kill()  # SIGKILL, mid-run
    restarted = server.restart()
    for t in threads:
        t.join()
    assert [e.state for e in ends] == ["completed"] * 2
    check_exactly_once(ledger)
    assert traincoord.Run(restarted.url, "py", "o", heartbeats=False).status()["state"] == \
        "completed"


def test_a_killed_workers_job_goes_to_another(server):
    # A worker process takes a job and dies without a word.
    code = ("import os, traincoord; r = traincoord.Run(%r, 'py', 'doomed'); "
            "j = r.next_job(); print(j.index, flush=True); os._exit(9)") % server.url
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO / "python", timeout=60)
    assert out.returncode == 9, out.stderr
    lost = int(out.stdout)
    ledger, lock = collections.defaultdict(list), threading.Lock()
    assert work(server.url, "survivor", ledger, lock).state == "completed"
    check_exactly_once(ledger)
    status = traincoord.Run(server.url, "py", "o", heartbeats=False).status()
    assert status["counters"]["lease_expiries"] >= 1
    assert lost in range(12)


def test_the_client_gives_up_when_the_coordinator_is_gone(server):
    run = traincoord.Run(server.url, "py", "lonely", heartbeats=False, give_up_after=0.5)
    server.kill()
    with pytest.raises(traincoord.Unreachable) as e:
        run.next_job()
    assert "giving up" in e.value.message


def test_tokens_are_required_and_checked(tmp_path, run_config):
    from conftest import Server
    import json
    import os
    import urllib.error
    import urllib.request

    tokens = tmp_path / "tokens"
    s = Server(["--config", str(run_config), "--in-memory", "--auth", "--token-dir", str(tokens)])
    try:
        admin = (tokens / "admin.token").read_text().strip()
        worker = (tokens / "runs" / "py.token").read_text().strip()
        assert oct(os.stat(tokens / "runs" / "py.token").st_mode & 0o777) == "0o600"
        assert oct(os.stat(tokens / "runs").st_mode & 0o777) == "0o700"
        assert len(worker) == 64 and worker != admin

        def status_of(path, token=None, body=None):
            req = urllib.request.Request(s.url + path, data=body,
                                         headers={"Authorization": f"Bearer {token}"} if token else {})
            try:
                return urllib.request.urlopen(req, timeout=10).status
            except urllib.error.HTTPError as e:
                return e.code

        assert status_of("/healthz") == 200
        assert status_of("/v1/runs/py") == 401
        assert status_of("/v1/runs/py", "wrong") == 403
        assert status_of("/v1/runs/py", worker) == 200
        assert status_of("/v1/runs", worker) == 403          # the list needs the admin token
        assert status_of("/v1/runs", admin) == 200
        assert status_of("/v1/runs/py/cancel", worker, b"{}") == 403
        assert status_of("/metrics", admin) == 200
        with pytest.raises(traincoord.CoordinatorError) as e:
            traincoord.Run(s.url, "py", "anon", token="")
        assert e.value.status == 401
        run = traincoord.Run(s.url, "py", "w", token=worker, heartbeats=False)
        job = run.next_job()
        job.complete(loss=1.0, samples=1)
        assert job.outcome == "accepted"
        # Created through the API (admin), a run gets its worker token at once.
        body = json.dumps({"name": "more", "data": {"train_batches": 2}}).encode()
        assert status_of("/v1/runs", admin, body) == 201
        assert (tokens / "runs" / "more.token").exists()
        # The scheme is case-insensitive (RFC 7235).
        req = urllib.request.Request(s.url + "/metrics", headers={"Authorization": f"bearer {admin}"})
        assert urllib.request.urlopen(req, timeout=10).status == 200
    finally:
        s.kill()


def test_workers_finish_the_run_over_tls_and_an_untrusted_certificate_is_refused(tmp_path,
                                                                                 run_config):
    from conftest import Server

    pki = tmp_path / "pki"
    subprocess.run([str(REPO / "tests" / "tls" / "make-certs"), str(pki)], check=True)
    s = Server(["--config", str(run_config), "--in-memory", "--tls-cert", str(pki / "server.pem"),
                "--tls-key", str(pki / "server-key.pem"), "--tls-client-ca", str(pki / "ca.pem")])
    try:
        assert s.url.startswith("https://")
        client_cert = {"cert_file": str(pki / "client.pem"), "key_file": str(pki / "client-key.pem")}
        # Not trusting the coordinator's CA: refused at once, not retried.
        with pytest.raises(traincoord.CoordinatorError) as e:
            traincoord.Run(s.url, "py", "w", ca_file=str(pki / "other-ca.pem"), give_up_after=60,
                           **client_cert)
        assert e.value.code == "tls"
        # No client certificate: the coordinator refuses the connection.
        with pytest.raises(traincoord.CoordinatorError) as e:
            traincoord.Run(s.url, "py", "w", ca_file=str(pki / "ca.pem"), give_up_after=60)
        assert e.value.code == "tls", e.value
        ledger, lock, ends = collections.defaultdict(list), threading.Lock(), []
        threads = [threading.Thread(target=lambda i=i: ends.append(
            work(s.url, f"t{i}", ledger, lock, ca_file=str(pki / "ca.pem"), **client_cert)))
            for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [e.state for e in ends] == ["completed"] * 2
        check_exactly_once(ledger)
    finally:
        s.kill()


def test_a_prefetching_job_loop_trains_every_batch_once(server):
    ledger, lock = collections.defaultdict(list), threading.Lock()
    outcomes = []

    def fed(name):
        with traincoord.Run(server.url, "py", name, long_poll=2) as run:
            jobs = []
            for job in run.jobs(prefetch=3):
                job.complete(loss=0.1 * (job.epoch + 1), samples=len(job.batches))
                jobs.append(job)
            outcomes.extend(j.outcome for j in jobs)  # all sent once the loop ended
            with lock:
                for j in jobs:
                    if j.outcome == "accepted":
                        ledger[(j.set, j.epoch)].extend(j.batches)
            return run.finished

    ends = []
    threads = [threading.Thread(target=lambda i=i: ends.append(fed(f"f{i}"))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e.state for e in ends] == ["completed", "completed"]
    assert None not in outcomes
    check_exactly_once(ledger)
