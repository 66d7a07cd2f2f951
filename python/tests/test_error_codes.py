"""Error codes: the coordinator names each error a worker meets with a code of its own, and the
client decides on that code, never on the message (docs/API.md)."""

import http.server
import json
import threading

import pytest

import traincoord


def test_errors_a_worker_meets_carry_their_own_code(server):
    with pytest.raises(traincoord.CoordinatorError) as e:
        traincoord.Run(server.url, "nope", "x", heartbeats=False)
    assert (e.value.status, e.value.code) == (404, traincoord.RUN_NOT_FOUND)
    owner = traincoord.Run(server.url, "py", "owner", heartbeats=False)
    other = traincoord.Run(server.url, "py", "other", heartbeats=False)
    job = owner.next_job()
    with pytest.raises(traincoord.CoordinatorError) as e:
        other._post("complete", {"worker": other.id, "lease": job.lease, "loss": 1.0})
    assert (e.value.status, e.value.code) == (409, traincoord.LEASE_NOT_YOURS)
    with pytest.raises(traincoord.CoordinatorError) as e:
        other._post("fail", {"worker": other.id, "lease": 10**9})
    assert (e.value.status, e.value.code) == (404, traincoord.LEASE_UNKNOWN)
    with pytest.raises(traincoord.CoordinatorError) as e:
        other._post("heartbeat", {"worker": 999}, registering=True)
    assert (e.value.status, e.value.code) == (404, traincoord.WORKER_NOT_REGISTERED)
    job.complete(loss=1.0, samples=1)
    assert job.outcome == "accepted"


def test_after_an_in_memory_restart_the_completion_is_lost_and_the_worker_registers_again(
        server):
    server.kill()
    forgetful = server.restart(in_memory=True)
    run = traincoord.Run(server.url, "py", "survivor", heartbeats=False, give_up_after=20)
    job = run.next_job()
    forgetful.kill()
    server.restart(in_memory=True)  # on the same port
    job.complete(loss=0.5, samples=2)
    assert job.outcome == "lost"
    assert run.next_job() is not None  # registered again
    assert run.status()["workers"][0]["name"] == "survivor"


class FakeCoordinator:
    """Answers each POST with the next canned (status, body), and records the paths."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.paths = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (the standard library's name)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.paths.append(self.path)
                status, body = fake.replies.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def error(code, message):
    return {"error": {"code": code, "message": message}}


REGISTERED = {"worker": 0, "heartbeat_interval_ms": 1000}
JOB = {"status": "job", "job": {"lease": 7, "attempt": 1, "set": "train", "epoch": 1,
                                "index": 0, "jobs_in_epoch": 4, "batches": [0, 1]}}


@pytest.fixture
def fake():
    fakes = []

    def start(replies):
        fakes.append(FakeCoordinator(replies))
        return fakes[-1]

    yield start
    for f in fakes:
        f.close()


def test_the_client_registers_again_on_the_code_whatever_the_message_says(fake):
    coordinator = fake([(200, REGISTERED),
                        (404, error("worker_not_registered", "who are you?")),
                        (200, {"worker": 5, "heartbeat_interval_ms": 1000}),
                        (200, JOB),
                        (404, error("lease_unknown", "no idea")),
                        ])
    run = traincoord.Run(coordinator.url, "r", "w", heartbeats=False)
    job = run.next_job()
    assert run.id == 5 and job.lease == 7
    job.complete(loss=0.5, samples=2)
    assert job.outcome == "lost"
    assert coordinator.paths == ["/v1/runs/r/workers", "/v1/runs/r/acquire",
                                 "/v1/runs/r/workers", "/v1/runs/r/acquire",
                                 "/v1/runs/r/complete"]


def test_a_message_that_reads_like_another_error_changes_nothing(fake):
    coordinator = fake([(200, REGISTERED),
                        (200, JOB),
                        (404, error("run_not_found", "worker 0 has not registered with run r")),
                        ])
    run = traincoord.Run(coordinator.url, "r", "w", heartbeats=False)
    job = run.next_job()
    with pytest.raises(traincoord.CoordinatorError) as e:
        job.complete(loss=0.5, samples=2)
    assert e.value.code == traincoord.RUN_NOT_FOUND
    assert job.outcome is None
    assert coordinator.paths.count("/v1/runs/r/workers") == 1  # not registered again


def test_a_reply_without_a_field_it_must_have_is_a_clear_error(fake):
    coordinator = fake([(200, REGISTERED),
                        (200, {"status": "job", "job": {"lease": 7, "attempt": 1}}),
                        ])
    run = traincoord.Run(coordinator.url, "r", "w", heartbeats=False)
    with pytest.raises(traincoord.CoordinatorError) as e:
        run.next_job()
    assert e.value.code == traincoord.BAD_REPLY
    assert "POST /v1/runs/r/acquire" in e.value.message and "'job.set'" in e.value.message


def test_a_reply_that_is_not_json_is_a_clear_error(fake):
    coordinator = fake([(200, "<html>a proxy's page</html>")])
    with pytest.raises(traincoord.CoordinatorError) as e:
        traincoord.Run(coordinator.url, "r", "w", heartbeats=False).next_job()
    assert e.value.code == traincoord.BAD_REPLY
