"""`traincoord launch` against a coordinator that never lets it in (docs/LAUNCH.md): the agent
backs off between its requests and gives up after --rdzv-timeout with one line saying what it
waited for; it presents its node's secret on every request, so that a second agent under the
same --node cannot disturb the first one's round."""

import http.server
import json
import subprocess
import threading
import time
import urllib.request

from conftest import BINARY


class FakeCoordinator:
    """Answers every POST with `answer` (JSON), every GET with 404; records the POSTs' bodies."""

    def __init__(self, answer):
        self.bodies = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 (the standard library's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.bodies.append((self.path, json.loads(body or b"{}")))
                self.reply(200, answer)

            def do_GET(self):  # noqa: N802
                self.reply(404, {"error": {"code": "run_not_found", "message": "no run"}})

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_agent(url, rdzv_timeout, limit, run="r", command=("/bin/true",)):
    """Runs an agent of node n1 against `url`; returns (exit code, output, seconds), stopping it
    at `limit`."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [BINARY, "launch", "--url", url, "--run", run, "--nnodes", "1", "--node", "n1",
         "--rdzv-timeout", str(rdzv_timeout), "--", *command],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        return None, out, time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode, out, time.monotonic() - start


def test_an_agent_answered_restart_forever_backs_off_and_gives_up():
    fake = FakeCoordinator({"state": "restart", "round": 1, "restart_count": 0,
                            "run_state": "running", "why": "a coordinator astray"})
    try:
        code, out, took = run_agent(fake.url, rdzv_timeout=5, limit=60)
    finally:
        fake.close()
    assert code == 1, f"exit {code} after {took:.0f} s, {len(fake.bodies)} requests: {out[-2000:]}"
    # A few requests a second at most (it sent 11,025 in 10 s), and no more than that.
    assert len(fake.bodies) < 200, len(fake.bodies)
    lines = [line for line in out.splitlines() if "gave up" in line]
    assert len(lines) == 1, out
    assert "--rdzv-timeout 5 s" in lines[0] and "`restart`" in lines[0], lines[0]
    assert "node n1" in lines[0] and "a coordinator astray" in lines[0], lines[0]


def test_an_agent_presents_its_nodes_secret_on_every_request():
    fake = FakeCoordinator({"state": "restart", "round": 1, "restart_count": 0,
                            "run_state": "running"})
    try:
        run_agent(fake.url, rdzv_timeout=1, limit=60)
    finally:
        fake.close()
    secrets = {body.get("secret") for _, body in fake.bodies}
    assert len(fake.bodies) >= 1 and len(secrets) == 1, fake.bodies
    secret = secrets.pop()
    assert isinstance(secret, str) and len(secret) >= 16, secret


def test_a_second_agent_under_a_nodes_name_cannot_disturb_its_round(serve_toml):
    server = serve_toml('name = "r"\n[data]\ntrain_batches = 4\n[schedule]\nepochs = 1\n')
    first = subprocess.Popen(
        [BINARY, "launch", "--url", server.url, "--run", "r", "--nnodes", "1", "--node", "n1",
         "--", "/bin/sleep", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def nodes():
            with urllib.request.urlopen(server.url + "/v1/runs/r/nodes", timeout=5) as r:
                return json.loads(r.read())
        deadline = time.monotonic() + 30
        while not nodes()["formed"]:
            assert time.monotonic() < deadline, nodes()
            time.sleep(0.1)
        # Another agent under the same name: refused (its secret is not n1's), so it waits, then
        # gives up; n1's round runs on, untouched.
        code, out, _ = run_agent(server.url, rdzv_timeout=2, limit=60)
        assert code == 1, out
        assert "gave up after --rdzv-timeout 2 s" in out and "another secret" in out, out
        after = nodes()
        assert after["round"] == 1 and after["formed"] and after["members"] == ["n1"], after
        assert after["last_end"] == "", after
    finally:
        first.kill()
        first.wait(timeout=10)
