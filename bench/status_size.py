#!/usr/bin/python3
"""The size and time of a run's status, and of what the dashboard fetches a poll, as the run
grows long (issue 31, item 17): starts `traincoord serve --in-memory`, trains a run of EPOCHS
one-job epochs through the API, then times each reply (the median of 5 GETs).

    bench/status_size.py build/traincoord [EPOCHS]      (default 20000)
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time


def main() -> None:
    binary = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "long.toml")
        with open(config, "w") as f:
            f.write(f'name = "long"\n[data]\ntrain_batches = 1\n[schedule]\nepochs = {epochs + 1}\n')
        server = subprocess.Popen([binary, "serve", "--config", config, "--in-memory",
                                   "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
        try:
            port = None
            deadline = time.monotonic() + 20
            while port is None and time.monotonic() < deadline:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", server.stdout.readline())
                port = int(m.group(1)) if m else None
            assert port, "the server did not start"
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

            def call(method: str, path: str, body: object = None) -> tuple[bytes, float]:
                start = time.perf_counter()
                conn.request(method, path, None if body is None else json.dumps(body))
                reply = conn.getresponse()
                data = reply.read()
                assert reply.status == 200 or method == "GET", (path, reply.status, data[:200])
                return (data if reply.status == 200 else b""), time.perf_counter() - start

            worker = json.loads(call("POST", "/v1/runs/long/workers", {"name": "w"})[0])["worker"]
            lease = json.loads(call("POST", "/v1/runs/long/acquire", {"worker": worker})[0])
            lease = lease["job"]["lease"]
            for i in range(epochs):
                r = json.loads(call("POST", "/v1/runs/long/complete",
                                    {"worker": worker, "lease": lease, "loss": 1 / (i + 1),
                                     "next": True})[0])
                lease = r["next"]["job"]["lease"]
            total = json.loads(call("GET", "/v1/runs/long/history?limit=0")[0]).get("jobs_total", 0)
            for path in ["/v1/runs/long", "/v1/runs/long?epochs=1000", "/v1/runs/long?epochs=0",
                         f"/v1/runs/long/history?from={epochs}&limit=5000&jobs_after={total}",
                         "/v1/runs/long/epochs?from=0", "/v1/runs/long/history"]:
                runs = sorted((call("GET", path) for _ in range(5)), key=lambda r: r[1])
                data, seconds = runs[2]
                if not data:
                    print(f"{'(none)':>10} {'':>14}  GET {path}")
                    continue
                print(f"{len(data):>10,} bytes {seconds * 1000:8.1f} ms  GET {path}")
        finally:
            server.send_signal(signal.SIGKILL)
            server.wait()


if __name__ == "__main__":
    main()
