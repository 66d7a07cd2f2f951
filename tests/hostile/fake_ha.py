#!/usr/bin/python3
"""Several coordinators in high-availability mode, faked for the clients' tests: a proxy per
"coordinator url" in front of one real `traincoord serve` (the run's state is shared, as the
etcd journal shares it), each playing the part the test gives it (docs/API.md, "Several
coordinators"; the wire protocol of issue 20):

    fake_ha.py UPSTREAM_URL [--count 2]

It listens on `count` free loopback ports and prints "ports P1 P2 ..." as its first line. It runs
until it is killed (the tests stop it by its PID, also when they fail), or until the process
that started it is gone. Each proxy is set through its own url:

    POST /__fake_ha {"mode": ..., "term": N, "leader": URL | null, ...}   (fields merged)
    GET  /__fake_ha                                                       (its counters)

Modes, for the requests about a run (/v1/runs/RUN/...):
  leader   forwards to the upstream and adds Traincoord-Term: term and Traincoord-Leader: its url
  standby  answers 421 {"error": {"code": "not_leader", "leader": leader, "term": leader_term,
           "retry_after_ms": retry_after_ms}} (with both headers when leader is set)
  stale    a deposed leader that does not know it: answers 200 with `stale_body` (default: the
           run finished, cancelled) and Traincoord-Term: term, forwarding nothing
  down     closes the connection without answering
Faults, in any mode: "drop_reply": {"path": SUBSTRING, "count": N} forwards the next N matching
requests and closes the connection instead of answering (a lost reply); "refuse": {"path":
SUBSTRING, "count": N} closes the connection without forwarding them; either may hold "then":
{settings} applied as it strikes (e.g. {"mode": "down"}: the leader died after the commit).
Requests elsewhere than a run (GET /v1/runs, /metrics, /healthz) are forwarded in every mode
but down.

Counters: requests (each "METHOD PATH" by mode), forwarded, not_leader, stale, dropped_replies,
refused.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import socket
import sys
import threading
import time
import urllib.parse

STALE_BODY = {"status": "finished", "state": "cancelled",
              "reason": "a stale reply of a deposed leader (fake_ha.py)"}


class Coordinator:
    """What one proxy plays, and what it met."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.lock = threading.Lock()
        self.url = ""
        self.settings = {"mode": "leader", "term": 1, "leader": None, "leader_term": None,
                         "retry_after_ms": 50, "stale_body": STALE_BODY, "drop_reply": None,
                         "refuse": None}
        self.counters = {"forwarded": 0, "not_leader": 0, "stale": 0, "dropped_replies": 0,
                         "refused": 0, "requests": []}

    def count(self, name: str, request: str | None = None) -> None:
        with self.lock:
            if request is not None:
                self.counters["requests"].append(request)
            else:
                self.counters[name] += 1

    def fault(self, kind: str, path: str) -> bool:
        """Whether this request meets the fault `kind` (and uses one of its count); the fault's
        "then" settings, if any, take effect at once (e.g. a leader that dies after it)."""
        with self.lock:
            fault = self.settings.get(kind)
            if not fault or fault.get("count", 0) <= 0 or fault.get("path", "") not in path:
                return False
            fault["count"] -= 1
            self.settings.update(fault.get("then") or {})
            return True


def make_handler(coordinator: Coordinator, upstreams: threading.local):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            # Headers and body leave in two writes: without this, each reply waits for a
            # delayed ACK (40 ms).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self.handle_one("GET")

        def do_POST(self) -> None:  # noqa: N802
            self.handle_one("POST")

        def answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def hang_up(self) -> None:
            self.close_connection = True

        def handle_one(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.path == "/__fake_ha":
                if method == "POST":
                    with coordinator.lock:
                        coordinator.settings.update(json.loads(body or b"{}"))
                with coordinator.lock:
                    out = json.dumps({**coordinator.counters, **coordinator.settings}).encode()
                self.answer(200, out, {})
                return
            with coordinator.lock:
                s = dict(coordinator.settings)
            coordinator.count("", f"{s['mode']} {method} {self.path}")
            about_a_run = self.path.startswith("/v1/runs/") and len(self.path) > 9
            if s["mode"] == "down" or coordinator.fault("refuse", self.path):
                coordinator.count("refused")
                self.hang_up()
                return
            headers: dict[str, str] = {}
            if about_a_run and s["mode"] == "standby":
                coordinator.count("not_leader")
                if s["leader"]:
                    headers = {"Traincoord-Term": str(s["leader_term"] or s["term"]),
                               "Traincoord-Leader": s["leader"]}
                error = {"code": "not_leader",
                         "message": f"{coordinator.url} does not lead this run; "
                                    f"the leader is {s['leader'] or 'not known (an election)'}",
                         "leader": s["leader"], "term": s["leader_term"] if s["leader"] else None,
                         "retry_after_ms": s["retry_after_ms"]}
                self.answer(421, json.dumps({"error": error}).encode(), headers)
                return
            if about_a_run and s["mode"] == "stale":
                coordinator.count("stale")
                self.answer(200, json.dumps(s["stale_body"]).encode(),
                            {"Traincoord-Term": str(s["term"]),
                             "Traincoord-Leader": coordinator.url})
                return
            status, reply = self.forward(method, body)
            coordinator.count("forwarded")
            if coordinator.fault("drop_reply", self.path):
                coordinator.count("dropped_replies")
                self.hang_up()
                return
            if about_a_run:
                headers = {"Traincoord-Term": str(s["term"]), "Traincoord-Leader": coordinator.url}
            self.answer(status, reply, headers)

        def forward(self, method: str, body: bytes) -> tuple[int, bytes]:
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() in ("content-type", "authorization")}
            for attempt in range(2):  # a kept-alive upstream connection may have been closed
                conn = getattr(upstreams, "conn", None)
                if conn is None:
                    conn = upstreams.conn = http.client.HTTPConnection(*coordinator.upstream,
                                                                       timeout=120)
                    conn.connect()
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    conn.request(method, self.path, body=body if method == "POST" else None,
                                 headers=headers)
                    reply = conn.getresponse()
                    return reply.status, reply.read()
                except (OSError, http.client.HTTPException):
                    conn.close()
                    upstreams.conn = None
                    if attempt == 1:
                        raise
            raise AssertionError("unreachable")

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("upstream")
    parser.add_argument("--count", type=int, default=2)
    args = parser.parse_args()
    parsed = urllib.parse.urlparse(args.upstream)
    servers = []
    for _ in range(args.count):
        coordinator = Coordinator((parsed.hostname, parsed.port))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                 make_handler(coordinator, threading.local()))
        server.daemon_threads = True
        coordinator.url = f"http://127.0.0.1:{server.server_address[1]}"
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ports " + " ".join(str(s.server_address[1]) for s in servers), flush=True)
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    sys.exit(0)


if __name__ == "__main__":
    main()
