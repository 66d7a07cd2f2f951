"""When the client heartbeats: only when a held lease has gone the interval the coordinator asks
for without being renewed (handed out, or listed in a heartbeat), not every interval whatever the
worker did (docs/PERFORMANCE.md, "Many workers"). A worker on jobs shorter than the interval sends
none; nor does a worker that holds nothing."""

import http.server
import json
import threading
import time

import traincoord
from traincoord.client import _HeldLeases

INTERVAL = 2.0


def test_nothing_held_no_heartbeat_due():
    held = _HeldLeases()
    assert held.due(INTERVAL) is None
    held.hold(7, 0.0)
    held.drop(7)
    assert held.due(INTERVAL) is None


def test_a_job_shorter_than_the_interval_is_never_due_for_a_heartbeat():
    held = _HeldLeases()
    now = 0.0
    for lease in range(1, 101):
        held.hold(lease, now)  # the reply that handed it out
        now += 1.5  # trains
        assert held.due(INTERVAL) > now, lease
        held.drop(lease)  # completed, with the request for the next job


def test_a_long_job_is_due_every_interval_from_its_last_renewal():
    held = _HeldLeases()
    held.hold(1, 0.0)
    held.hold(2, 0.5)
    assert held.due(INTERVAL) == 2.0  # the oldest decides
    assert sorted(held.renew_all(2.0)) == [1, 2]  # a heartbeat lists and renews them all
    assert held.due(INTERVAL) == 4.0
    held.drop(1)
    held.hold(3, 2.1)
    assert held.due(INTERVAL) == 4.0
    held.clear()
    assert held.due(INTERVAL) is None


class Coordinator:
    """Registers with a 100 ms heartbeat interval, hands out one job, answers heartbeats, and
    records each request's path and body."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (the standard library's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with fake.lock:
                    fake.requests.append((self.path, body))
                if self.path.endswith("/workers"):
                    reply = {"worker": 0, "heartbeat_interval_ms": 100, "lease_timeout_ms": 300}
                elif self.path.endswith("/acquire"):
                    reply = {"status": "job", "job": {
                        "lease": 7, "attempt": 1, "set": "train", "epoch": 1, "index": 0,
                        "jobs_in_epoch": 4, "batches": [0]}}
                else:
                    reply = {"leases": body.get("leases", []), "state": "running"}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def heartbeats(self):
        with self.lock:
            return [body for path, body in self.requests if path.endswith("/heartbeat")]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_heartbeat_thread_sends_only_for_a_held_lease():
    coordinator = Coordinator()
    try:
        run = traincoord.Run(coordinator.url, "r", "w")
        time.sleep(0.5)  # five intervals with nothing held
        assert coordinator.heartbeats() == []
        job = run.next_job()
        assert job.lease == 7
        for _ in range(200):  # held past the interval: due (bounded wait)
            if coordinator.heartbeats():
                break
            time.sleep(0.05)
        assert coordinator.heartbeats()[0]["leases"] == [7]
        run.close()
    finally:
        coordinator.close()
