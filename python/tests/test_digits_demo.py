"""The demo, shortened: DDP on 2 ranks for 4 epochs through `traincoord launch`, then the
coordinator's own record is checked."""

import sqlite3
import subprocess

from conftest import BINARY, REPO

CONFIG = (REPO / "examples" / "digits" / "digits.toml").read_text().replace(
    "epochs = 30", "epochs = 4")


def test_the_digits_demo_trains_every_batch_once_and_learns(tmp_path):
    config = tmp_path / "digits.toml"
    config.write_text(CONFIG)
    data = tmp_path / "data"
    out = subprocess.run(
        [BINARY, "launch", "--workers", "2", "--config", str(config), "--data-dir", str(data),
         "--", "/usr/bin/python3", str(REPO / "examples" / "digits" / "train.py"),
         "--checkpoint", str(tmp_path / "best.pt")],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "run digits completed" in out.stderr or "early_stopped" in out.stderr
    assert (tmp_path / "best.pt").exists()

    db = sqlite3.connect(f"file:{data}/traincoord.db?mode=ro", uri=True)
    # Every train job of every epoch completed exactly once. The demo runs in step mode: 1,437
    # samples over 2 ranks at 32 a batch are 23 steps, 46 jobs (one batch each) an epoch, and
    # their samples are the whole set.
    rows = db.execute("SELECT epoch, job, count(*), sum(samples) FROM completions "
                      "WHERE set_name = 'train' GROUP BY epoch, job").fetchall()
    assert all(count == 1 for _, _, count, _ in rows)
    by_epoch, samples = {}, {}
    for epoch, job, _, n in rows:
        by_epoch.setdefault(epoch, set()).add(job)
        samples[epoch] = samples.get(epoch, 0) + n
    assert by_epoch == {e: set(range(46)) for e in range(4)}
    assert samples == {e: 1437 for e in range(4)}
    # Both ranks trained (dynamic sharding, not one rank doing everything).
    workers = {w for (w,) in db.execute("SELECT DISTINCT worker FROM completions")}
    assert workers == {"rank0", "rank1"}
    # A broken training loop stays near 10% (chance); this one learns.
    accuracy = [a for (a,) in db.execute(
        "SELECT avg(json_extract(metrics, '$.accuracy')) FROM completions "
        "WHERE set_name = 'dev' GROUP BY epoch ORDER BY epoch")]
    assert accuracy[-1] > 0.85, accuracy
