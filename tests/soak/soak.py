"""Soak test: thousands of simulated workers on one coordinator, for a bounded time.

Workers (asyncio, raw HTTP/1.1 keep-alive) register, take jobs and complete them; at random
they drop their connection (and reconnect), stop heartbeating for a while, or die holding a job
(its lease then expires). Garbage requests are mixed in on connections of their own. The
server's resident memory and open file descriptors are sampled throughout. At the end: the run
completed, every batch of every epoch was completed exactly once, and memory is flat (the last
samples are within a bound of the samples after warm-up).

    /usr/bin/python3 tests/soak/soak.py --traincoord build/traincoord --workers 2000 --minutes 30
CI runs a short version (tests/soak/test_soak.py).
"""

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

CONFIG = """
name = "soak"
[data]
train_batches = {train}
dev_batches = {dev}
[schedule]
epochs = {epochs}
[leases]
timeout = 2.0
"""


class Stats:
    def __init__(self):
        self.requests = self.garbage = self.disconnects = self.deaths = self.silences = 0
        self.ledger = {}  # (set, epoch) -> list of batches counted for us


async def request(conn, method, path, body=None):
    reader, writer = conn
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: soak\r\nContent-Length: {len(data)}\r\n\r\n"
    writer.write(head.encode() + data)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed")
    status = int(status_line.split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    payload = await reader.readexactly(length)
    return status, json.loads(payload) if payload else {}


async def connect(port):
    return await asyncio.open_connection("127.0.0.1", port)


async def worker(i, port, stats, rng, stop):
    name = f"w{i}"
    conn = await connect(port)
    status, reg = await request(conn, "POST", "/v1/runs/soak/workers", {"name": name})
    wid = reg["worker"]
    job = None
    silent_until = 0.0
    while not stop.is_set():
        try:
            r = rng.random()
            if r < 0.01:  # drop the connection, reconnect
                conn[1].close()
                stats.disconnects += 1
                conn = await connect(port)
                continue
            if r < 0.012 and job is not None:  # die holding the job; come back as new later
                stats.deaths += 1
                job = None
                await asyncio.sleep(rng.uniform(0, 3))
                continue
            if r < 0.02:
                silent_until = time.monotonic() + rng.uniform(0, 4)  # heartbeats stop, start
                stats.silences += 1
            if job is None:
                status, a = await request(conn, "POST", "/v1/runs/soak/acquire",
                                          {"worker": wid, "wait_ms": 2000,
                                           "request": rng.getrandbits(50) | 1})
            else:
                await asyncio.sleep(rng.uniform(0, 0.05))  # "training"
                if time.monotonic() > silent_until and rng.random() < 0.3:
                    await request(conn, "POST", "/v1/runs/soak/heartbeat",
                                  {"worker": wid, "leases": [job["lease"]]})
                    stats.requests += 1
                status, a = await request(conn, "POST", "/v1/runs/soak/complete",
                                          {"worker": wid, "lease": job["lease"], "loss": 0.5,
                                           "samples": len(job["batches"]), "next": True,
                                           "wait_ms": 2000, "request": rng.getrandbits(50) | 1})
                if status == 200 and a["outcome"] in ("accepted", "duplicate"):
                    stats.ledger.setdefault((job["set"], job["epoch"]), []).extend(job["batches"])
                a = a.get("next", a)
            stats.requests += 1
            job = a["job"] if status == 200 and a.get("status") == "job" else None
            if status == 200 and a.get("status") == "finished":
                stop.set()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            stats.disconnects += 1
            try:
                conn = await connect(port)
            except OSError:
                await asyncio.sleep(0.1)
    conn[1].close()


async def garbage(port, stats, rng, stop):
    junk = [b"GARBAGE\r\n\r\n", b"POST /v1/runs/soak/complete HTTP/1.1\r\nContent-Length: 3\r\n\r\n{{{",
            b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", bytes(rng.getrandbits(8) for _ in range(200)),
            b"POST /v1/runs/soak/acquire HTTP/1.1\r\nHost: x\r\n"]
    while not stop.is_set():
        try:
            reader, writer = await connect(port)
            writer.write(rng.choice(junk))
            await writer.drain()
            await asyncio.wait_for(reader.read(4096), 0.5)
            writer.close()
        except (OSError, asyncio.TimeoutError):
            pass
        stats.garbage += 1
        await asyncio.sleep(0.005)


def sample(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def soak(args):
    train = max(200, args.workers)
    tmp = tempfile.mkdtemp(prefix="traincoord-soak-")
    config = os.path.join(tmp, "soak.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(train=train, dev=train // 10, epochs=10_000))
    server = subprocess.Popen([args.traincoord, "serve", "--config", config, "--data-dir",
                               os.path.join(tmp, "data"), "--durability", "os",
                               "--listen", "127.0.0.1:0", "--max-connections", "100000"],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stdout:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        stats, rng, stop = Stats(), random.Random(args.seed), asyncio.Event()
        tasks = [asyncio.create_task(worker(i, port, stats, random.Random(rng.random()), stop))
                 for i in range(args.workers)]
        tasks += [asyncio.create_task(garbage(port, stats, random.Random(rng.random()), stop))
                  for _ in range(4)]
        samples, start = [], time.monotonic()
        while time.monotonic() - start < args.minutes * 60:
            await asyncio.sleep(min(5, args.minutes * 60 / 20))
            samples.append(sample(server.pid))
        # Wind down: end the run where it is (cancel) so that workers finish.
        cancel = await connect(port)
        await request(cancel, "POST", "/v1/runs/soak/cancel", {"reason": "soak over"})
        reader, writer = cancel
        _, status = await request(cancel, "GET", "/v1/runs/soak")
        writer.close()
        stop.set()
        await asyncio.wait(tasks, timeout=30)
        for t in tasks:
            t.cancel()
        return stats, samples, status
    finally:
        server.kill()
        server.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--traincoord", default="build/traincoord")
    p.add_argument("--workers", type=int, default=2000)
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    stats, samples, status = asyncio.run(soak(args))

    # Every closed epoch: every batch exactly once.
    closed = [(e["set"], e["epoch"]) for e in status["epochs"] if e["closed"]]
    sizes = {"train": max(200, args.workers), "dev": max(200, args.workers) // 10}
    broken = [k for k in closed if sorted(stats.ledger.get(k, [])) != list(range(sizes[k[0]]))]
    twice = [k for k, v in stats.ledger.items() if len(v) != len(set(v))]
    warm = samples[len(samples) // 4:] or samples
    first = sum(r for r, _ in warm[: max(1, len(warm) // 3)]) / max(1, len(warm) // 3)
    last = sum(r for r, _ in warm[-max(1, len(warm) // 3):]) / max(1, len(warm) // 3)
    report = {
        "minutes": args.minutes, "workers": args.workers, "requests": stats.requests,
        "garbage_requests": stats.garbage, "disconnects": stats.disconnects,
        "deaths": stats.deaths, "heartbeat_silences": stats.silences,
        "epochs_closed": len(closed), "lease_expiries": status["counters"]["lease_expiries"],
        "rss_kib_after_warmup": round(first), "rss_kib_at_end": round(last),
        "fds_max": max(f for _, f in samples), "fds_at_end": samples[-1][1],
        "epochs_not_exactly_once": broken, "batches_counted_twice": twice,
    }
    print(json.dumps(report, indent=1))
    ok = not broken and not twice and len(closed) >= 2 and last <= first * 1.25 + 8192
    print("soak:", "passed" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
