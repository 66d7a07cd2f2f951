#!/usr/bin/python3
"""The journals side by side, in one run on this machine (docs/PERFORMANCE.md, "High
availability"): job cycles per second and latency of one coordinator with its SQLite journal
(the default) and with the etcd journal on a 3-member etcd cluster on loopback, both driven by
bench/loadgen with the same workers; then the failover time of two coordinators on that
cluster, from the leader's SIGKILL to the first job the new leader hands out (p50, max).
Prints the figures and the ratios with their targets (issue 20: etcd >= 0.5x SQLite at 64
workers; failover under 5 s with the default --lease-ttl). Every process it starts is stopped
by its PID at the end, also on failure.

    bench/ha_compare.py [--seconds S] [--workers W] [--failovers N] [--rounds R]
                        [--baseline OTHER_TRAINCOORD]

With --baseline, another build of traincoord (say, of the commit before a change) serves the
etcd journal too, in turns with this one, on the same etcd cluster (a prefix each): before and
after, side by side in one run. --rounds R repeats the turns (SQLite, baseline, this build) R
times; the best of each is printed (the machine is shared: the best is the least disturbed).

Needs build/ (scripts/build) and etcd (scripts/install-deps)."""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINCOORD = REPO / "build" / "traincoord"
LOADGEN = REPO / "build" / "loadgen"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"

FAILOVER_RUN = """name = "failover"
[data]
train_batches = 1000000
[schedule]
epochs = 1
[leases]
timeout = 60
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Every process started, stopped by PID at the end."""

    def __init__(self):
        self.procs = []

    def start(self, args, log):
        p = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM):
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def stop_all(self):
        for p in reversed(self.procs):
            self.stop(p)


def http(method, url, body=None, timeout=5):
    """(status, parsed JSON body or None); (0, None) when nothing answered."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except ValueError:
            return e.code, None
    except (OSError, ValueError):
        return 0, None


def wait_until(what, predicate, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"ha_compare: {what} did not happen within {seconds} s")


def start_etcd(procs, work):
    members = [(f"m{i}", free_port(), free_port()) for i in range(3)]
    cluster = ",".join(f"{n}=http://127.0.0.1:{peer}" for n, _, peer in members)
    for name, client, peer in members:
        procs.start([ETCD, f"--name={name}", f"--data-dir={work}/{name}.etcd",
                     f"--listen-client-urls=http://127.0.0.1:{client}",
                     f"--advertise-client-urls=http://127.0.0.1:{client}",
                     f"--listen-peer-urls=http://127.0.0.1:{peer}",
                     f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                     f"--initial-cluster={cluster}", "--initial-cluster-state=new",
                     "--initial-cluster-token=ha-compare", "--logger=zap",
                     f"--log-outputs={work}/{name}.log"], f"{work}/{name}.out")
    endpoints = ",".join(f"127.0.0.1:{client}" for _, client, _ in members)
    wait_until("etcd's first leader", lambda: http(
        "GET", f"http://127.0.0.1:{members[0][1]}/health")[0] == 200)
    # Which member leads Raft: a build whose etcd client keeps to the first member of the list
    # (before writes went to the leader) sends every write through m0.
    ids, leader = {}, None
    for name, client, _ in members:
        status, st = http("POST", f"http://127.0.0.1:{client}/v3/maintenance/status", {})
        if status == 200 and st:
            ids[st["header"]["member_id"]] = name
            leader = st.get("leader")
    print(f"etcd's Raft leader: {ids.get(leader, '?')} (the first member of the list: m0)",
          file=sys.stderr, flush=True)
    return endpoints


def serve(procs, work, name, args, binary=TRAINCOORD):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = procs.start([str(binary), "serve", "--listen", f"127.0.0.1:{port}", *args],
                    f"{work}/{name}.out")
    # Ready once it serves runs (with etcd: once it leads, after its election).
    wait_until(f"{name} serving", lambda: http("GET", f"{url}/v1/runs")[0] == 200 or
               p.poll() is not None)
    if p.poll() is not None:
        raise RuntimeError(f"ha_compare: {name} exited:\n" + Path(f"{work}/{name}.out").read_text())
    if "--journal" in args:  # (a standby answers /v1/runs too) once it has read etcd: leadership
        # is per run, and the run the load generator creates is led by this coordinator
        wait_until(f"{name} joined", lambda: ((http("GET", f"{url}/v1/coordinator")[1] or {})
                                              .get("members") or 0) >= 1)
    return p, url


def load(procs, url, server, workers, seconds):
    out = subprocess.run([str(LOADGEN), "traincoord", "--url", url, "--workers", str(workers),
                          "--seconds", str(seconds), "--warmup", "2", "--train-batches", "20000",
                          "--lease-timeout", "60", "--server-pid", str(server.pid), "--json"],
                         capture_output=True, text=True, timeout=seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"ha_compare: loadgen failed:\n{out.stdout}\n{out.stderr}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    if figures["violations"] or figures["errors"]:
        raise RuntimeError(f"ha_compare: wrong answers or errors: {figures}")
    return figures


def commits(url):
    """Requests per journal write and the mean write's milliseconds, from the server's /metrics
    (the whole run, warm-up included)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        for series in ("traincoord_store_commit_batch_requests", "traincoord_store_commit_duration_seconds"):
            for part in ("_sum", "_count"):
                if line.startswith(series + part + " "):
                    values[series + part] = float(line.split()[-1])
        for series in ("traincoord_etcd_writes_total", "traincoord_etcd_record_bytes_total",
                       "traincoord_etcd_snapshot_bytes_total", "traincoord_etcd_snapshots_total"):
            if line.startswith(series + " "):
                values[series] = float(line.split()[-1])
    batch = "traincoord_store_commit_batch_requests"
    duration = "traincoord_store_commit_duration_seconds"
    if not values.get(batch + "_count") or not values.get(duration + "_count"):
        return {}
    out = {"requests_per_write": values[batch + "_sum"] / values[batch + "_count"],
           "write_ms": 1000 * values[duration + "_sum"] / values[duration + "_count"]}
    # (builds since the snapshots went deflated say how many bytes they put in etcd)
    if values.get("traincoord_etcd_writes_total") and "traincoord_etcd_snapshots_total" in values:
        writes = values["traincoord_etcd_writes_total"]
        out["etcd_bytes_per_write"] = (values["traincoord_etcd_record_bytes_total"] +
                                       values["traincoord_etcd_snapshot_bytes_total"]) / writes
        out["snapshots"] = values["traincoord_etcd_snapshots_total"]
        out["snapshot_kb"] = (values["traincoord_etcd_snapshot_bytes_total"] / 1024 /
                              max(1, values["traincoord_etcd_snapshots_total"]))
    return out


def leader_of(urls):
    for u in urls:
        if http("GET", f"{u}/v1/runs/failover", timeout=2)[0] == 200:
            return u
    return None


def failovers(procs, work, etcd, rounds, lease_ttl):
    """Seconds from each SIGKILL of the leader to the first job the new leader handed out."""
    config = Path(work) / "failover.toml"
    config.write_text(FAILOVER_RUN)
    journal = f"etcd://{etcd}/failover"
    coordinators = {}
    for name in ("a", "b"):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = ["--config", str(config), "--journal", journal, "--advertise-url", url,
                "--lease-ttl", str(lease_ttl)]
        coordinators[url] = (name, args)
    procs_of = {}
    for url, (name, args) in coordinators.items():
        p = procs.start([str(TRAINCOORD), "serve", "--listen", url[len("http://"):], *args],
                        f"{work}/{name}.out")
        procs_of[url] = p
    wait_until("a leader", lambda: leader_of(list(coordinators)) is not None)
    leader = leader_of(list(coordinators))
    status, reply = http("POST", f"{leader}/v1/runs/failover/workers", {"name": "probe"})
    assert status == 200, (status, reply)
    worker = reply["worker"]
    times = []
    for _ in range(rounds):
        leader = leader_of(list(coordinators))
        standby = next(u for u in coordinators if u != leader)
        wait_until("the standby to follow", lambda: http(
            "GET", f"{standby}/v1/runs/failover", timeout=2)[0] == 421)
        procs.stop(procs_of[leader], signal.SIGKILL)
        killed = time.monotonic()
        while True:
            status, reply = http("POST", f"{standby}/v1/runs/failover/acquire",
                                 {"worker": worker, "wait_ms": 0}, timeout=2)
            if status == 200 and reply and reply.get("status") == "job":
                times.append(time.monotonic() - killed)
                break
            if time.monotonic() - killed > 60:
                raise RuntimeError("ha_compare: no new leader within 60 s")
            time.sleep(0.02)
        name, args = coordinators[leader]  # back as a standby
        procs_of[leader] = procs.start(
            [str(TRAINCOORD), "serve", "--listen", leader[len("http://"):], *args],
            f"{work}/{name}.out")
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--failovers", type=int, default=5)
    p.add_argument("--lease-ttl", type=float, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--baseline", type=Path, default=None,
                   help="another traincoord binary, measured on the etcd journal in turns")
    a = p.parse_args()
    for tool in (TRAINCOORD, LOADGEN):
        if not tool.exists():
            sys.exit(f"ha_compare: {tool} is missing; run scripts/build")
    if not os.path.exists(ETCD):
        sys.exit("ha_compare: etcd is missing; run scripts/install-deps")
    procs = Processes()
    work = tempfile.mkdtemp(prefix="traincoord-ha-compare-")
    load_before = os.getloadavg()
    per_round = []  # each round's cycles/s by journal
    try:
        rows = {}
        etcd = None
        for r in range(a.rounds):
            per_round.append({})
            turns = [("sqlite", TRAINCOORD)]
            if a.baseline:
                turns.append(("etcd (baseline)", a.baseline))
            turns.append(("etcd", TRAINCOORD))
            for name, binary in turns:
                if name == "sqlite":
                    args = ["--data-dir", f"{work}/sqlite{r}"]
                else:
                    if etcd is None:
                        etcd = start_etcd(procs, work)
                    prefix = "/base" if binary != TRAINCOORD else "/bench"
                    args = ["--journal", f"etcd://{etcd}{prefix}{r}"]
                server, url = serve(procs, work, f"{name.split()[0]}{r}", args, binary)
                figures = load(procs, url, server, a.workers, a.seconds)
                figures.update(commits(url))
                procs.stop(server)
                per_round[-1][name] = figures["cycles_per_s"]
                print(f"round {r + 1}: {name}: {figures['cycles_per_s']:.0f} cycles/s"
                      + (f", {figures['requests_per_write']:.1f} requests per write of "
                         f"{figures['write_ms']:.2f} ms" if "write_ms" in figures else "")
                      + (f", {figures['etcd_bytes_per_write']:.0f} bytes put in etcd per write "
                         f"({figures['snapshots']:.0f} snapshots of {figures['snapshot_kb']:.0f} "
                         "KiB)" if "etcd_bytes_per_write" in figures else "")
                      + f" (load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
                if name not in rows or figures["cycles_per_s"] > rows[name]["cycles_per_s"]:
                    rows[name] = figures
        times = failovers(procs, work, etcd, a.failovers, a.lease_ttl) if a.failovers else []
    except BaseException:
        procs.stop_all()
        print(f"ha_compare: failed; the logs are in {work}", file=sys.stderr)
        raise
    finally:
        procs.stop_all()
    shutil.rmtree(work, ignore_errors=True)
    print(f"{f'journal ({a.workers} workers, {a.seconds:g} s)':30}   cycles/s     p50 µs    p99 µs"
          "   server CPU µs/cycle")
    for name, f in rows.items():
        print(f"{name:30} {f['cycles_per_s']:10.0f} {f['p50_us']:10.0f} "
              f"{f['p99_us']:9.0f} {f['server_cpu_us_per_cycle']:10.1f}"
              + (f"   {f['requests_per_write']:.1f} requests per write of {f['write_ms']:.2f} ms"
                 if "write_ms" in f else ""))
    if a.baseline:
        base = rows["etcd (baseline)"]["cycles_per_s"] / rows["sqlite"]["cycles_per_s"]
        print(f"etcd (baseline) / SQLite throughput: {base:.2f}x")
    ratio = rows["etcd"]["cycles_per_s"] / rows["sqlite"]["cycles_per_s"]
    print(f"etcd / SQLite throughput: {ratio:.2f}x (target >= 0.5x), best of each")
    for r, row in enumerate(per_round):
        print(f"round {r + 1}: etcd / SQLite {row['etcd'] / row['sqlite']:.2f}x"
              + (f", baseline / SQLite {row['etcd (baseline)'] / row['sqlite']:.2f}x, "
                 f"etcd / baseline {row['etcd'] / row['etcd (baseline)']:.2f}x"
                 if 'etcd (baseline)' in row else ""))
    print(f"load average (1 min): {load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} "
          "at the end")
    if not times:
        return
    print(f"failover (SIGKILL -> first job from the new leader, --lease-ttl {a.lease_ttl:g}), "
          f"{len(times)} kills: p50 {statistics.median(times):.2f} s, max {max(times):.2f} s "
          f"(target < 5 s); each: {', '.join(f'{t:.2f}' for t in times)}")


if __name__ == "__main__":
    main()
