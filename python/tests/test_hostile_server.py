"""The Python client against a broken or hostile coordinator (tests/hostile/hostile_server.py):
every misbehaviour ends in the client's own error naming the request (and the field), within
its deadline, and without reading an unbounded reply into memory.

Each case runs the client in a child process of its own, so that a hang is cut off by the
child's timeout and its memory is measured alone (VmHWM minus VmRSS before the request)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "hostile" / "hostile_server.py"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

TIMEOUT_S, GIVE_UP_S = 3.0, 8.0
# Generous: the last attempt may start just before give_up_after, and runs for one timeout.
WITHIN_S = GIVE_UP_S + TIMEOUT_S * 2 + 2


@contextlib.contextmanager
def hostile_server(mode, *args):
    """The fixture on a free loopback port: yields (url, log file); stopped by its PID."""
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"hostile-{os.getpid()}-{mode}.log"
    log = open(log_path, "w+")
    proc = subprocess.Popen([PYTHON, str(FIXTURE), mode, *args], stdout=log,
                            stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        deadline = time.monotonic() + 10
        while port is None and time.monotonic() < deadline:
            text = log_path.read_text()
            if text.startswith("port "):
                port = int(text.split()[1])
            else:
                time.sleep(0.05)
        assert port, f"the hostile server did not start: {log_path.read_text()}"
        yield f"http://127.0.0.1:{port}", log_path
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()
        log_path.unlink(missing_ok=True)


CLIENT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {python_dir!r})
    import traincoord.client as tc

    def kb(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])

    before = kb("VmRSS")
    start = time.monotonic()
    out = {{}}
    try:
        run = tc.Run({url!r}, "r", "w0", timeout={timeout}, give_up_after={give_up},
                     first_contact_timeout={give_up}, heartbeats={heartbeats})
        {then}
        out["ok"] = True
    except BaseException as e:
        out.update(type=type(e).__name__, message=str(e), code=getattr(e, "code", None),
                   status=getattr(e, "status", None),
                   coordinator_error=isinstance(e, tc.CoordinatorError))
    out["elapsed"] = time.monotonic() - start
    out["growth_mb"] = (kb("VmHWM") - before) / 1024
    print(json.dumps(out))
""")


def run_client(url, then="pass", heartbeats=False, timeout_s=90):
    code = CLIENT.format(python_dir=str(REPO / "python"), url=url, timeout=TIMEOUT_S,
                         give_up=GIVE_UP_S, heartbeats=heartbeats, then=then)
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_client_error(out, code=None):
    assert out.get("coordinator_error"), out  # the client's own error, not a TypeError & co
    if code is not None:
        assert out["code"] == code, out
    assert "/v1/runs/r/workers" in out["message"], out  # names the request


def test_nested_reply_is_a_bad_reply():
    with hostile_server("nested") as (url, _):
        out = run_client(url)
    assert_client_error(out, "bad_reply")


def test_field_of_the_wrong_type_is_a_bad_reply_naming_it():
    with hostile_server("wrong_types") as (url, _):
        out = run_client(url)
    assert_client_error(out, "bad_reply")
    assert "heartbeat_interval_ms" in out["message"], out


def test_error_that_is_not_an_object_is_a_client_error():
    with hostile_server("error_string") as (url, _):
        out = run_client(url)
    assert_client_error(out)
    assert out["status"] == 409 and "nope" in out["message"], out


def test_redirect_is_a_client_error_saying_so():
    with hostile_server("redirect") as (url, _):
        out = run_client(url)
    assert_client_error(out)
    assert out["status"] == 302 and "302" in out["message"], out
    assert "127.0.0.1:9/elsewhere" in out["message"], out  # where it pointed


@pytest.mark.parametrize("mode", ["huge", "chunked"])
def test_reply_over_the_cap_is_refused_without_reading_it(mode):
    with hostile_server(mode) as (url, _):
        out = run_client(url)
    assert_client_error(out, "bad_reply")
    assert "MiB" in out["message"], out
    assert out["growth_mb"] < 100, out
    assert out["elapsed"] < WITHIN_S, out


@pytest.mark.parametrize("mode", ["drip", "continue", "silent"])
def test_a_reply_that_never_completes_is_given_up_in_time(mode):
    with hostile_server(mode) as (url, _):
        out = run_client(url)
    assert_client_error(out, "unreachable")
    assert out["elapsed"] < WITHIN_S, out
    assert out["growth_mb"] < 100, out
    assert f"{TIMEOUT_S:g} s" in out["message"], out  # the deadline it applied


def test_server_given_heartbeat_interval_is_bounded_below():
    with hostile_server("heartbeat0") as (url, log):
        out = run_client(url, then="time.sleep(2); run.close()", heartbeats=True)
        heartbeats = log.read_text().count("/heartbeat")
    assert out.get("ok"), out
    assert heartbeats <= 30, heartbeats  # 100 ms at least between two: about 20 in 2 s
