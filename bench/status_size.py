#!/usr/bin/python3
"""The size and time of a run's status, and of what the dashboard fetches a poll, as the run
grows long (issue 31, item 17; issue 34's targets): starts `traincoord serve --in-memory`,
trains runs of EPOCHS one-job epochs through the API (each completion reporting its loss and
METRICS metrics, as `phase.report(loss, lr=..., accuracy=...)` does), then times each reply.

    bench/status_size.py build/traincoord [EPOCHS] [--compare K] [--metrics M]
        (defaults: 20000 epochs, 1 compared run, 2 metrics)

First the replies one by one (the median of 5 GETs, timed by this client); then one poll of the
dashboard as web/app.js makes it a second, on the run "long" with K other runs as long compared
beside it (`/?run=long&compare=cmp1,...`), one completion after the page's previous poll:

    GET /v1/coordinator, GET /v1/runs,
    GET /v1/runs/long?epochs=0, .../history?from=P&limit=5000&jobs_after=K, .../series?after=N,
    per compared run: .../history?from=P&limit=5000&jobs_after=2^53-1, .../series?after=N

Each reply's size, and its time in the server (from the arrival of the request to its reply,
as the server's `traincoord_http_request_duration_seconds_sum` in GET /metrics counts it: the
change across BATCH of the same request, less what the GET /metrics before them adds, divided by
BATCH; the median of REPEAT batches) and as this client waited for it (the median of all), summed
per poll and set against issue 34's targets: a poll of at most 50 KB and 20 ms. Last, what
opening the page costs once: the whole history (5,000 epochs a request) and series of each run.
"""
import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time

TARGET_BYTES = 50_000
TARGET_MS = 20.0
NO_JOBS = 2**53 - 1  # (the dashboard's jobs_after for a compared run: no completions)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("epochs", nargs="?", type=int, default=20000)
    ap.add_argument("--compare", type=int, default=1, help="compared runs (as long)")
    ap.add_argument("--metrics", type=int, default=2, help="metrics each completion reports")
    ap.add_argument("--repeat", type=int, default=9, help="batches (medians of)")
    ap.add_argument("--batch", type=int, default=200, help="requests a batch")
    args = ap.parse_args()
    epochs = args.epochs
    runs = ["long"] + [f"cmp{i + 1}" for i in range(args.compare)]
    metric_names = (["lr", "accuracy"] + [f"m{i}" for i in range(args.metrics)])[:args.metrics]
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "long.toml")
        with open(config, "w") as f:
            f.write(f'name = "long"\n[data]\ntrain_batches = 1\n[schedule]\nepochs = {epochs + 1}\n')
        server = subprocess.Popen([binary_path(args.binary), "serve", "--config", config,
                                   "--in-memory", "--listen", "127.0.0.1:0"],
                                  stdout=subprocess.PIPE, text=True)
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
                assert reply.status in (200, 201) or method == "GET", (path, reply.status, data[:200])
                return (data if reply.status == 200 else b""), time.perf_counter() - start

            for run in runs[1:]:
                call("POST", "/v1/runs", {"name": run, "data": {"train_batches": 1},
                                          "schedule": {"epochs": epochs + 1}})
            start = time.monotonic()
            for k, run in enumerate(runs):
                worker = json.loads(call("POST", f"/v1/runs/{run}/workers", {"name": "w"})[0])["worker"]
                lease = json.loads(call("POST", f"/v1/runs/{run}/acquire", {"worker": worker})[0])
                lease = lease["job"]["lease"]
                for i in range(epochs):
                    loss = (k + 1) / (i + 1)
                    metrics = {name: loss * (j + 2) / 10 for j, name in enumerate(metric_names)}
                    r = json.loads(call("POST", f"/v1/runs/{run}/complete",
                                        {"worker": worker, "lease": lease, "loss": loss,
                                         "metrics": metrics, "next": True})[0])
                    lease = r["next"]["job"]["lease"]
            print(f"trained {len(runs)} runs of {epochs:,} epochs ({len(metric_names)} metrics a "
                  f"completion) in {time.monotonic() - start:.0f} s\n")

            total = json.loads(call("GET", "/v1/runs/long/history?limit=0")[0]).get("jobs_total", 0)
            print("One reply at a time (the median of 5, timed by the client):")
            for path in ["/v1/runs/long", "/v1/runs/long?epochs=1000", "/v1/runs/long?epochs=0",
                         f"/v1/runs/long/history?from={epochs}&limit=5000&jobs_after={total}",
                         "/v1/runs/long/epochs?from=0", "/v1/runs/long/history",
                         "/v1/runs/long/series", f"/v1/runs/long/series?after={total}"]:
                replies = sorted((call("GET", path) for _ in range(5)), key=lambda r: r[1])
                data, seconds = replies[2]
                if not data:
                    print(f"{'(none)':>10} {'':>14}  GET {path}")
                    continue
                print(f"{len(data):>10,} bytes {seconds * 1000:8.2f} ms  GET {path}")

            # The server's time for a request: the change of the latency histogram's sum across
            # it, less what a GET /metrics alone adds (the one that read the sum before it).
            def server_sum() -> float:
                text = call("GET", "/metrics")[0].decode()
                m = re.search(r"^traincoord_http_request_duration_seconds_sum (\S+)$", text, re.M)
                return float(m.group(1))

            def metrics_alone() -> float:
                samples = []
                for _ in range(4 * args.repeat):
                    before = server_sum()
                    samples.append(server_sum() - before)
                return statistics.median(samples)

            metrics_s = metrics_alone()

            def measure(path: str) -> tuple[int, float, float]:
                in_server, client, size = [], [], 0
                for _ in range(args.repeat):
                    before = server_sum()
                    for _ in range(args.batch):
                        data, seconds = call("GET", path)
                        client.append(seconds)
                        size = len(data)
                    in_server.append(max(0.0, server_sum() - before - metrics_s) / args.batch)
                return size, statistics.median(in_server), statistics.median(client)

            # The dashboard's poll, one completion after its previous one: the status without
            # epochs, the epochs from the one that was open (now closed) with the newer
            # completion, the series' newer points; each compared run's epochs and series alike.
            poll = ["/v1/coordinator", "/v1/runs", "/v1/runs/long?epochs=0"]
            for run in runs:
                h = json.loads(call("GET", f"/v1/runs/{run}/history?limit=0")[0])
                jobs_after = h["jobs_total"] - 1 if run == "long" else NO_JOBS
                poll.append(f"/v1/runs/{run}/history?from={h['epochs_total'] - 2}&limit=5000"
                            f"&jobs_after={jobs_after}")
                poll.append(f"/v1/runs/{run}/series?after={h['jobs_total'] - 1}")
            print(f"\nOne dashboard poll (/?run=long&compare={','.join(runs[1:])}), one completion "
                  f"after the last; server time the median of {args.repeat} batches of {args.batch} "
                  f"(a GET /metrics alone, {metrics_s * 1000:.2f} ms, taken off), client time "
                  f"the median of them all:")
            sizes, server_ms, client_ms = 0, 0.0, 0.0
            for path in poll:
                size, in_server, client = measure(path)
                sizes += size
                server_ms += in_server * 1000
                client_ms += client * 1000
                print(f"{size:>10,} bytes {in_server * 1000:8.3f} ms server {client * 1000:8.3f} ms "
                      f"client  GET {path}")
            ok = lambda v, t: "meets" if v <= t else "MISSES"
            print(f"{sizes:>10,} bytes {server_ms:8.3f} ms server {client_ms:8.3f} ms client  "
                  f"the poll: {ok(sizes, TARGET_BYTES)} ≤ {TARGET_BYTES // 1000} KB, "
                  f"{ok(server_ms, TARGET_MS)} ≤ {TARGET_MS:.0f} ms (server)")

            # Opening the page: each run's whole history a page of 5,000 epochs at a time (the
            # chosen run's with its last 4,096 completions, a compared run's without), and its
            # whole series.
            print("\nOpening the page once (client time):")
            for run in runs:
                size, seconds, start = 0, 0.0, 0
                jobs_after = 0 if run == "long" else NO_JOBS
                while True:
                    data, t = call("GET", f"/v1/runs/{run}/history?from={start}&limit=5000"
                                          f"&jobs_after={jobs_after}")
                    h = json.loads(data)
                    size, seconds = size + len(data), seconds + t
                    jobs_after = h["jobs_total"] if run == "long" else NO_JOBS
                    start = h["epochs_from"] + len(h["epochs"])
                    if start >= h["epochs_total"] or not h["epochs"]:
                        break
                data, t = call("GET", f"/v1/runs/{run}/series?after=0")
                print(f"{size:>10,} bytes {seconds * 1000:8.1f} ms  {run}: its history "
                      f"({h['epochs_total']:,} epochs, 5,000 a request); "
                      f"{len(data):,} bytes {t * 1000:.1f} ms its series")
        finally:
            server.send_signal(signal.SIGKILL)
            server.wait()


def binary_path(path: str) -> str:
    return path if os.sep in path else os.path.join(".", path)


if __name__ == "__main__":
    main()
