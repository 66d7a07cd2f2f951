#!/usr/bin/python3
"""A hostile (or broken) coordinator for the clients' tests: it answers every HTTP request the
way its mode says, and logs each request it reads to stdout ("request METHOD PATH").

    hostile_server.py MODE [--drip-s 2] [--depth 200000] [--size 314572800]

It listens on a free loopback port and prints "port N" as its first line. It runs until it is
killed (the tests stop it by its PID, also when they fail), or until the process that started
it is gone. Modes:

  nested       200 with {"worker": 1, "x": [[[...]]]} nested --depth deep
  huge         200 with a Content-Length of --size bytes, sent as fast as the client reads
  drip         the reply of `ok`, one byte every --drip-s seconds
  chunked      200 with an endless chunked body
  continue     an endless stream of "100 Continue" interim replies
  wrong_types  200 with every field of the wrong type ("heartbeat_interval_ms": "x", ...)
  error_string 409 with {"error": "nope"} (an error that is not an object)
  redirect     302 Found to another address
  silent       reads the request and never answers
  heartbeat0   a well-formed coordinator that asks for heartbeats every 0 ms; acquires wait
  ok           a well-formed coordinator (registration, acquires wait, status)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

OK_REPLIES = {
    "workers": {"worker": 1, "heartbeat_interval_ms": 10000, "generation": 0},
    "acquire": {"status": "wait"},
    "heartbeat": {"extended": []},
    "leave": {},
}
STATUS = {"run": "r", "state": "running", "epochs": [], "workers": [], "events": []}


def reply(status: str, body: bytes, headers: str = "", content_type: str = "application/json"):
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{headers}\r\n").encode() + body


def ok_body(path: str) -> bytes:
    action = path.rstrip("/").rsplit("/", 1)[-1]
    if path.startswith("/v1/runs/") and path.count("/") == 3:
        return json.dumps(STATUS).encode()  # GET /v1/runs/RUN
    if path == "/v1/runs":
        return json.dumps({"runs": [{"run": "r", "state": "running"}]}).encode()
    return json.dumps(OK_REPLIES.get(action, {})).encode()


def read_request(conn: socket.socket, pending: bytes) -> tuple[str, str, bytes] | None:
    """Reads one request (headers and a Content-Length body); None when the client left."""
    while b"\r\n\r\n" not in pending:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        pending += chunk
        if len(pending) > 1 << 20:
            return None
    head, pending = pending.split(b"\r\n\r\n", 1)
    lines = head.decode(errors="replace").split("\r\n")
    method, path = (lines[0].split(" ") + ["", ""])[:2]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip() or 0)
    while len(pending) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        pending += chunk
    print(f"request {method} {path}", flush=True)
    return method, path, pending[length:]


def serve(conn: socket.socket, args: argparse.Namespace) -> None:
    pending = b""
    with conn:
        while True:
            request = read_request(conn, pending)
            if request is None:
                return
            method, path, pending = request
            mode = args.mode
            if mode == "nested":
                n = args.depth
                conn.sendall(reply("200 OK", b'{"worker": 1, "x": ' + b"[" * n + b"]" * n + b"}"))
            elif mode == "huge":
                conn.sendall((f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              f"Content-Length: {args.size}\r\n\r\n").encode())
                block = b" " * 65536
                sent = 0
                while sent < args.size:
                    conn.sendall(block[:args.size - sent])
                    sent += len(block)
            elif mode == "drip":
                for byte in reply("200 OK", ok_body(path)):
                    conn.sendall(bytes([byte]))
                    time.sleep(args.drip_s)
            elif mode == "chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                chunk = b"10000\r\n" + b" " * 65536 + b"\r\n"
                while True:
                    conn.sendall(chunk)
            elif mode == "continue":
                while True:
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    time.sleep(0.001)
            elif mode == "wrong_types":
                conn.sendall(reply("200 OK", json.dumps({
                    "worker": 1, "heartbeat_interval_ms": "x", "generation": [],
                    "status": 5, "outcome": {}, "job": "j", "jobs": "j", "runs": "r",
                    "run": 7, "state": [], "epochs": "e", "workers": {}}).encode()))
            elif mode == "error_string":
                conn.sendall(reply("409 Conflict", b'{"error": "nope"}'))
            elif mode == "redirect":
                conn.sendall(reply("302 Found", b"",
                                   "Location: http://127.0.0.1:9/elsewhere\r\n"))
            elif mode == "silent":
                while conn.recv(65536):
                    pass
                return
            elif mode == "heartbeat0" and path.endswith("/workers"):
                conn.sendall(reply("201 Created", b'{"worker": 1, "heartbeat_interval_ms": 0}'))
            else:  # ok, heartbeat0
                if path.endswith("/acquire"):
                    time.sleep(0.2)  # a short long poll
                conn.sendall(reply("200 OK", ok_body(path)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--drip-s", type=float, default=2.0)
    parser.add_argument("--depth", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=300 << 20)
    args = parser.parse_args()
    # Never outlive the test that started it, even one killed before it could stop us.
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"port {listener.getsockname()[1]}", flush=True)

    def run(conn: socket.socket) -> None:
        try:
            serve(conn, args)
        except OSError:
            pass  # the client gave up: that is what the tests want

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=run, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
