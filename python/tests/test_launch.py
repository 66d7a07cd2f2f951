"""`traincoord launch`: whole-group restarts, rank-prefixed output, epoch lines, exit codes, and a
changed config on an existing data dir (docs/PYTHON.md, "traincoord launch")."""

import subprocess

from conftest import BINARY, REPO

RUN = """
name = "l"
[data]
train_batches = 12
[schedule]
epochs = 2
[leases]
timeout = 2
"""

WORKER = """
import os, sys, time
sys.path.insert(0, {python!r})
import traincoord
rank, restart = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("group", os.environ["TRAINCOORD_GROUP"], "rank", rank, "restart", restart, flush=True)
run = traincoord.Run.from_env()
if rank == "1" and restart < {fail_until}:
    time.sleep(0.2)
    print("rank 1 fails", file=sys.stderr, flush=True)
    sys.exit(3)
for n, job in enumerate(run.jobs()):
    if rank == "0" and {hang}:
        time.sleep(3600)  # stopped by the launcher when rank 1 fails
    job.complete(loss=0.5, samples=1)
print("done", flush=True)
"""


def launch(tmp_path, *args, fail_until=0, hang=False, config=RUN, timeout=120):
    (tmp_path / "run.toml").write_text(config)
    (tmp_path / "w.py").write_text(WORKER.format(python=str(REPO / "python"),
                                                 fail_until=fail_until, hang=hang))
    return subprocess.run([BINARY, "launch", "--config", str(tmp_path / "run.toml"),
                           "--listen", "127.0.0.1:0", *args, "--", "/usr/bin/python3", str(tmp_path / "w.py")],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def test_a_failed_rank_restarts_the_whole_group_as_a_new_group(tmp_path):
    r = launch(tmp_path, "--workers", "2", "--max-restarts", "2", "--grace", "5", fail_until=1)
    assert r.returncode == 0, r.stderr
    # Every line of a worker is prefixed with its rank; the restarted group has a new name.
    groups = {line.split()[2] for line in r.stdout.splitlines() if " group " in line}
    assert groups == {"rdzv-r1", "rdzv-r2"}, r.stdout
    assert "[rank1]: rank 1 fails" in r.stderr
    assert "worker rank1 exited with 3" in r.stderr
    assert "restarting the group (1 of 2)" in r.stderr
    assert "[rank0]: done" in r.stdout and "[rank1]: done" in r.stdout
    # A line per closed epoch.
    assert "[l] train epoch 0 closed: loss 0.5" in r.stderr
    assert "[l] train epoch 1 closed: loss 0.5" in r.stderr


def test_restarts_exhausted_stop_the_group_and_exit_1(tmp_path):
    r = launch(tmp_path, "--workers", "2", "--max-restarts", "1", "--grace", "1",
               fail_until=99, hang=True)
    assert r.returncode == 1, r.stderr
    assert "worker rank1 exited with 3; no restart left (--max-restarts 1)" in r.stderr
    # rank 0 was stopped (SIGTERM) rather than left behind, and that is no failure of its own.
    assert "worker rank0 stopped with its group (exit 143)" in r.stderr, r.stderr
    assert "worker rank0 exited with" not in r.stderr, r.stderr


def test_a_changed_config_on_an_existing_data_dir_is_refused(tmp_path):
    data = str(tmp_path / "data")
    first = launch(tmp_path, "--workers", "1", "--data-dir", data)
    assert first.returncode == 0, first.stderr
    changed = RUN.replace("epochs = 2", "epochs = 3")
    r = launch(tmp_path, "--workers", "1", "--data-dir", data, config=changed)
    assert r.returncode == 2, r.stderr
    assert "was started with a different config; these fields differ: schedule.epochs" in r.stderr
    # The same config resumes the finished run: nothing left to train.
    again = launch(tmp_path, "--workers", "1", "--data-dir", data)
    assert again.returncode == 0, again.stderr
    assert "run l completed" in again.stderr
