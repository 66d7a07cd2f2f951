"""GET /metrics, parsed with the Prometheus text-format parser (Debian's
python3-prometheus-client), agrees with the run's state."""

import collections
import threading
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import traincoord
from test_client import work


def scrape(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_parse_and_agree_with_the_run(server):
    ledger, lock = collections.defaultdict(list), threading.Lock()
    assert work(server.url, "m1", ledger, lock).state == "completed"
    run = traincoord.Run(server.url, "py", "observer", heartbeats=False)
    status = run.status()
    m = scrape(server.url)
    r = (("run", "py"),)

    def get(name, **labels):
        return m[(name, tuple(sorted({"run": "py", **labels}.items())))]

    assert get("traincoord_run_state", state="completed") == 1
    assert get("traincoord_run_state", state="running") == 0
    assert get("traincoord_run_epochs_done") == 3
    assert get("traincoord_run_target_epoch") == status["plan"]["target_epoch"]
    assert get("traincoord_run_jobs", state="done") == status["progress"]["jobs_done"]
    assert get("traincoord_run_jobs", state="planned") == status["progress"]["jobs_planned"]
    assert get("traincoord_run_completions_accepted_total") == \
        status["counters"]["completions_accepted"]
    dev = [e for e in status["epochs"] if e["set"] == "dev"]
    assert abs(get("traincoord_run_last_loss", set="dev") - dev[-1]["loss"]) < 1e-12
    assert get("traincoord_run_best_epoch") == status["early_stop"]["best_epoch"]
    assert get("traincoord_worker_jobs_done_total", worker="m1") == \
        next(w["jobs_done"] for w in status["workers"] if w["name"] == "m1")
    # Server series: requests by endpoint and status, latency and commit histograms.
    assert m[("traincoord_http_requests_total",
              (("endpoint", "complete"), ("status", "200")))] >= 30
    assert m[("traincoord_http_request_duration_seconds_count", ())] >= 30
    assert m[("traincoord_store_commit_duration_seconds_count", ())] >= 1
    assert m[("traincoord_http_connections", ())] >= 1
    # (the run is too short to fill the WAL: the checkpointer's counters are there, at 0)
    assert m[("traincoord_store_checkpoints_total", ())] == 0
    assert m[("traincoord_store_wal_restarts_total", ())] == 0
    assert m[("traincoord_store_checkpoint_failures_total", ())] == 0
    assert r  # the run label is on every per-run series
