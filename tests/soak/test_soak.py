"""The soak test, short: 300 workers for 20 s (tests/soak/soak.py runs it as long as asked)."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_a_short_soak_keeps_the_run_correct_and_memory_flat():
    binary = os.environ.get("TRAINCOORD_BIN", str(HERE.parents[1] / "build" / "traincoord"))
    out = subprocess.run([sys.executable, str(HERE / "soak.py"), "--traincoord", binary,
                          "--workers", "300", "--minutes", "0.34"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "soak: passed" in out.stdout
