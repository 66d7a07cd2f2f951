#!/usr/bin/python3
"""What an etcd transaction costs through etcd's JSON gateway, as the etcd journal writes them
(docs/PERFORMANCE.md, "High availability"): a 3-member cluster on loopback (one disk), then
for each shape, clients writing transactions back to back for a few seconds each:
  - by size: one put of N bytes per transaction (the journal puts a wave's records in one key);
  - by concurrency: C clients at once, each txn with 64/C puts of 400 bytes (would pipelining,
    several transactions in flight, raise etcd's throughput?).
  - by member: to the Raft leader, or to a follower (which forwards it).
Prints transactions/s, ms per transaction and bytes or records per second. Every member is
killed by its PID at the end, also on failure.

    bench/etcd_txn_cost.py [--seconds S]"""

import argparse
import base64
import http.client
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def b64(s):
    return base64.b64encode(s.encode()).decode()


def writer(port, ops_of, seconds, out):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    txns = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        body = json.dumps({"compare": [], "success": ops_of(txns)}).encode()
        conn.request("POST", "/v3/kv/txn", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        if reply.status != 200:
            raise RuntimeError(f"etcd answered {reply.status}")
        txns += 1
    out.append(txns)


def measure(port, clients, ops_of, seconds):
    out = []
    threads = [threading.Thread(target=writer, args=(port, lambda k, c=c: ops_of(c, k), seconds, out))
               for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    txns = sum(out)
    return txns / seconds, 1000 * seconds * clients / max(txns, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--where-only", action="store_true",
                   help="only the leader against a follower")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="traincoord-etcd-txn-")
    members = [(f"m{i}", free_port(), free_port()) for i in range(3)]
    cluster = ",".join(f"{n}=http://127.0.0.1:{peer}" for n, _, peer in members)
    procs = []
    try:
        for name, client, peer in members:
            procs.append(subprocess.Popen(
                [ETCD, f"--name={name}", f"--data-dir={work}/{name}",
                 f"--listen-client-urls=http://127.0.0.1:{client}",
                 f"--advertise-client-urls=http://127.0.0.1:{client}",
                 f"--listen-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-cluster={cluster}", "--logger=zap",
                 f"--log-outputs={work}/{name}.log"]))
        port = members[0][1]
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if b'"true"' in r.read():
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("etcd did not become healthy in 30 s")
            time.sleep(0.1)
        # Which member leads Raft: a write sent to a follower is forwarded to the leader, and
        # answered once the follower has applied it too (a longer way round).
        ids, leader = {}, None
        for name, client, _ in members:
            st = json.loads(urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{client}/v3/maintenance/status", data=b"{}"), timeout=5).read())
            ids[st["header"]["member_id"]] = client
            leader = st["leader"]
        lead_port = ids[leader]
        follower_port = next(c for _, c, _ in members if c != lead_port)
        for rounds in range(2):
            for where, at in (("the leader", lead_port), ("a follower", follower_port)):
                rate, ms = measure(at, 1, lambda c, k: [
                    {"requestPut": {"key": b64(f"/where/{k}"), "value": b64("r" * 3200)}}],
                    a.seconds)
                print(f"1 client, one put of 3200 bytes per txn, to {where}: {rate:6.0f} txn/s, "
                      f"{ms:5.1f} ms per txn", flush=True)
        for clients in (1, 2, 4):
            rate, ms = measure(lead_port, clients, lambda c, k: [
                {"requestPut": {"key": b64(f"/pipe/{c}/{k}"), "value": b64("r" * 3200)}}],
                a.seconds)
            print(f"{clients} clients at once, one put of 3200 bytes per txn, to the leader: "
                  f"{rate:6.0f} txn/s, {ms:5.1f} ms per txn", flush=True)
        if a.where_only:
            return
        port = lead_port
        for size in (100, 1600, 3200, 6400, 25600):
            rate, ms = measure(port, 1, lambda c, k, size=size: [
                {"requestPut": {"key": b64(f"/size/{k}"), "value": b64("r" * size)}}], a.seconds)
            print(f"1 client, one put of {size:6} bytes per txn: {rate:6.0f} txn/s, {ms:5.1f} ms "
                  f"per txn, {rate * size / 1e6:5.2f} MB/s", flush=True)
        for clients in (1, 2, 4, 8):
            per = 64 // clients
            rate, ms = measure(port, clients, lambda c, k, per=per: [
                {"requestPut": {"key": b64(f"/conc/{c}/{k}/{i}"), "value": b64("r" * 400)}}
                for i in range(per)], a.seconds)
            print(f"{clients} clients, {per:2} puts of 400 bytes per txn: {rate:6.0f} txn/s, "
                  f"{ms:5.1f} ms per txn, {rate * per:6.0f} records/s", flush=True)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
