"""Fixtures: the real traincoord binary on a free loopback port, stopped after each test."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[2]
BINARY = os.environ.get("TRAINCOORD_BIN", str(REPO / "build" / "traincoord"))

RUN_TOML = """
name = "py"
[data]
train_batches = 24
dev_batches = 6
order = "shuffled"
seed = 5
[schedule]
epochs = 3
iters_per_worker = 2
[leases]
timeout = 0.5
"""


class Server:
    def __init__(self, args, port=0):
        self.args = args
        self.proc = subprocess.Popen([BINARY, "serve", *args, "--listen", f"127.0.0.1:{port}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        seen = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            seen += line
            m = re.search(r"listening on (https?)://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(2))
                self.url = f"{m.group(1)}://127.0.0.1:{self.port}"
                return
        self.kill()
        raise RuntimeError(f"traincoord serve did not start:\n{seen}")

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)


@pytest.fixture
def serve_toml(tmp_path):
    """Starts an in-memory coordinator on a run config given as TOML text; stops it after."""
    servers = []

    def start(toml):
        config = tmp_path / f"run{len(servers)}.toml"
        config.write_text(toml)
        servers.append(Server(["--config", str(config), "--in-memory"]))
        return servers[-1]

    yield start
    for s in servers:
        s.kill()


@pytest.fixture
def run_config(tmp_path):
    path = tmp_path / "py.toml"
    path.write_text(RUN_TOML)
    return path


@pytest.fixture
def server(tmp_path, run_config):
    servers = []

    def start(port=0, in_memory=False):
        args = ["--config", str(run_config)]
        args += ["--in-memory"] if in_memory else ["--data-dir", str(tmp_path / "data")]
        s = Server(args, port)
        servers.append(s)
        return s

    first = start()
    first.restart = lambda in_memory=False: start(first.port, in_memory)
    yield first
    for s in servers:
        s.kill()
