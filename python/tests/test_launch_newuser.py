"""`traincoord launch` for someone coming from torchrun (issue 33, docs/LAUNCH.md): a *.py runs
with python3, torchrun's spellings work or are refused naming ours, no wait is silent or endless,
the state of `launch --config` survives the launcher, and the output says each thing once."""

import os
import signal
import socket
import subprocess

from conftest import BINARY, REPO, Server

RUN = """
name = "u"
[data]
train_batches = 6
[schedule]
epochs = 2
[leases]
timeout = 2
"""

# A rank: trains its jobs; with a checkpoint file (cut.json), restores its cut first. With
# CHECKPOINT_AT=N it takes a cut after N jobs, saves it and waits to be killed with the launcher.
# With SLOW_EPOCH=E it pauses 3 s at the start of epoch E (an epoch line is due meanwhile).
WORKER = """
import json, os, sys, time
sys.path.insert(0, {python!r})
import traincoord
run = traincoord.Run.from_env()
if os.path.exists("cut.json"):
    run.restore(cut=json.load(open("cut.json"))["cut"])
    print("restored", flush=True)
at, slow = int(os.environ.get("CHECKPOINT_AT", 0)), int(os.environ.get("SLOW_EPOCH", -1))
for n, job in enumerate(run.jobs(), 1):
    if job.epoch == slow:
        print("epoch", slow, "begins", flush=True)
        time.sleep(3)
        slow = -1
    job.complete(loss=0.5, samples=1)
    if n == at and not os.path.exists("cut.json"):
        cut = run.cut(1, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))["cut"]
        with open("cut.json.tmp", "w") as f:
            json.dump({{"cut": cut}}, f)
        os.replace("cut.json.tmp", "cut.json")
        print("checkpointed", flush=True)
        time.sleep(3600)  # killed with its launcher (PR_SET_PDEATHSIG)
print("done", flush=True)
"""

ENV = {**os.environ, "PATH": "/usr/bin:" + os.environ.get("PATH", "")}


def write(tmp_path):
    (tmp_path / "run.toml").write_text(RUN)
    (tmp_path / "train.py").write_text(WORKER.format(python=str(REPO / "python")))


def launch(tmp_path, *args, env=None, timeout=120):
    return subprocess.run([BINARY, "launch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path, env={**ENV, **(env or {})})


def test_a_py_script_and_torchruns_underscore_spellings_work(tmp_path):
    write(tmp_path)
    # As one types it for torchrun: no interpreter, no `--`, underscores, --standalone.
    r = launch(tmp_path, "--nproc_per_node", "2", "--max_restarts", "1", "--standalone",
               "--config", "run.toml", "--listen", "127.0.0.1:0", "train.py")
    assert r.returncode == 0, r.stderr
    assert "train.py runs with /usr/bin/python3" in r.stderr, r.stderr
    assert "[rank0]: done" in r.stdout and "[rank1]: done" in r.stdout, r.stdout


def test_torchrun_flags_we_have_no_use_for_are_refused_naming_ours(tmp_path):
    write(tmp_path)
    cases = [
        (["--node_rank", "1", "--config", "run.toml"], "--node-rank: node ranks follow the order",
         "--node"),
        (["--rdzv-backend", "etcd", "--config", "run.toml"], "--rdzv-backend etcd", "--url"),
        (["--standalone", "--nnodes", "1"], "--standalone: give --config RUN.toml", "--config"),
        (["--master_addr", "10.0.0.1", "--config", "run.toml"], "--master-addr", "--url"),
        (["--rdzv_conf", "is_host=1", "--config", "run.toml"], "--rdzv-conf is_host",
         "join_timeout"),
    ]
    for args, said, flag in cases:
        r = launch(tmp_path, *args, "train.py", timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert said in r.stderr and flag in r.stderr, (args, r.stderr)


def test_a_wrong_url_fails_fast_with_a_clear_error(tmp_path):
    # --rdzv-endpoint HOST:PORT is --url http://HOST:PORT; nothing listens there (the old agent
    # tried for --rdzv-timeout, 120 s, in silence: past this test's limit).
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = launch(tmp_path, "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "u", "--",
               "/bin/true", timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"cannot reach a coordinator at http://127.0.0.1:{port}" in r.stderr, r.stderr
    assert "check --url" in r.stderr, r.stderr


def test_a_script_started_without_the_launcher_is_told_how_to_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCOORD_")}
    r = subprocess.run(["/usr/bin/python3", "-c", f"import sys; sys.path.insert(0, "
                        f"{str(REPO / 'python')!r}); import traincoord; "
                        "traincoord.Run.from_env()"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode != 0
    assert "TRAINCOORD_URL is not set: start this script with `traincoord launch" in r.stderr, \
        r.stderr
    assert "TRAINCOORD_URL=http://HOST:8470" in r.stderr, r.stderr


def agent(url, *args, limit=60):
    """An agent of node n1 of run u; returns (exit code, output); killed at `limit`."""
    proc = subprocess.Popen([BINARY, "launch", "--url", url, "--run", "u", "--node", "n1",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=ENV)
    try:
        out, _ = proc.communicate(timeout=limit)
        return proc.returncode, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_an_agent_alone_says_whom_it_waits_for_and_gives_up_after_join_timeout(serve_toml):
    server = serve_toml(RUN)
    code, out = agent(server.url, "--nnodes", "2", "--join_timeout", "3", "--", "/bin/true")
    assert code == 1, out
    assert "waiting for nodes: 1 of 2 (n1)" in out, out
    lines = [line for line in out.splitlines() if "gave up" in line]
    assert len(lines) == 1 and "--join-timeout 3 s waiting for nodes: 1 of 2 (n1)" in lines[0], out


def test_rdzv_timeout_holds_while_the_ranks_run(tmp_path):
    (tmp_path / "run.toml").write_text(RUN)
    server = Server(["--config", str(tmp_path / "run.toml"), "--in-memory"])
    try:
        proc = subprocess.Popen([BINARY, "launch", "--url", server.url, "--run", "u", "--node",
                                 "n1", "--rdzv-timeout", "3", "--node-timeout", "1", "--grace",
                                 "1", "--", "/bin/sleep", "120"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            line = proc.stdout.readline()
            while line and "node rank 0" not in line:
                line = proc.stdout.readline()
            server.kill()  # the coordinator vanishes under the running round
            out, _ = proc.communicate(timeout=60)  # (the old agent waited for its ranks: 120 s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    finally:
        server.kill()
    assert proc.returncode == 1, out
    gave_up = [line for line in out.splitlines() if "gave up" in line]
    assert len(gave_up) == 1 and "--rdzv-timeout 3 s" in gave_up[0], out
    assert "ranks were stopped" in gave_up[0], out
    assert 1 <= out.count("does not answer") <= 2, out  # said, and not at every poll


def test_launch_keeps_its_state_and_resumes_a_checkpoint_after_it_was_killed(tmp_path):
    write(tmp_path)
    args = ["--config", "run.toml", "--listen", "127.0.0.1:0", "--node-timeout", "1", "train.py"]
    first = subprocess.Popen([BINARY, "launch", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                             env={**ENV, "CHECKPOINT_AT": "3"})
    try:
        line = first.stdout.readline()
        while line and "checkpointed" not in line:
            line = first.stdout.readline()
        assert "checkpointed" in line
        first.send_signal(signal.SIGKILL)  # its rank dies with it
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    assert (tmp_path / "u.traincoord").is_dir()
    again = launch(tmp_path, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[rank0]: restored" in again.stdout, again.stdout
    assert "the run resumes from it" in again.stderr, again.stderr
    assert "run u completed" in again.stderr, again.stderr


def test_epoch_lines_come_as_epochs_close_and_each_line_once(tmp_path):
    write(tmp_path)
    proc = subprocess.run([BINARY, "launch", "--config", "run.toml", "--in-memory", "--listen",
                           "127.0.0.1:0", "train.py"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120, cwd=tmp_path,
                          env={**ENV, "SLOW_EPOCH": "1"})
    out = proc.stdout
    assert proc.returncode == 0, out
    lines = out.splitlines()
    # Epoch 0 closed while the rank paused 3 s in epoch 1: its line came before the rank ended.
    closed = next(i for i, line in enumerate(lines) if "train epoch 0 closed" in line)
    done = next(i for i, line in enumerate(lines) if "[rank0]: done" in line)
    assert closed < done, out
    progress = [line for line in lines if " run " in line and " jobs" in line]
    assert len(progress) == len(set(progress)), out
    assert not any(line.rstrip().endswith(":") for line in lines), out
    assert not (tmp_path / "u.traincoord").exists()
