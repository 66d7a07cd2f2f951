"""Checkpoint cuts and restores survive the coordinator's kill -9, before and after a restore
(the journal keeps them as it keeps every request; docs/SEMANTICS.md, "Checkpoint cuts")."""

import json
import urllib.error
import urllib.request


def call(server, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post(server, action, body):
    return call(server, "POST", f"/v1/runs/py/{action}", body)


def ok(reply):
    status, body = reply
    assert status == 200, body
    return body


def test_a_cut_and_its_restore_survive_kill_9(server):
    first_server = server
    # Group g1: a job with 1 of its 2 batches trained at the cut, another completed after it.
    w = ok(post(server, "workers", {"name": "rank0", "group": "g1"}))["worker"]
    jobs = ok(post(server, "acquire", {"worker": w, "group": "g1", "jobs": 2}))["jobs"]
    partial, later = jobs
    assert len(partial["batches"]) == 2
    cut = ok(post(server, "cuts", {"worker": w, "group": "g1", "seq": 1, "rank": 0,
                                   "world_size": 1,
                                   "parts": [{"lease": partial["lease"], "batches": 1,
                                              "loss": 0.75, "samples": 8}]}))
    assert cut["complete"] and cut["cut"] == 1
    ok(post(server, "complete", {"worker": w, "group": "g1", "lease": later["lease"],
                                 "loss": 1.0, "samples": 16}))

    server.kill()  # kill -9 before the restore
    server = first_server.restart()
    cuts = ok(call(server, "GET", "/v1/runs/py/cuts"))["cuts"]
    assert [c["id"] for c in cuts] == [1]
    assert cuts[0]["complete"] and cuts[0]["partial_jobs"] == 1 and cuts[0]["jobs_done"] == 0
    status = ok(call(server, "GET", "/v1/runs/py"))
    assert status["generation"] == 1 and status["progress"]["jobs_done"] == 1

    # Group g2 (the restarted training job) must restore; then kill -9 right after it did.
    w2 = ok(post(server, "workers", {"name": "rank0", "group": "g2"}))
    assert w2["group_state"] == "restore_required" and w2["latest_cut"] == 1
    code, refused = post(server, "acquire", {"worker": w2["worker"], "group": "g2"})
    assert code == 409 and refused["error"]["code"] == "restore_required"
    restored = ok(post(server, "restore", {"group": "g2", "cut": 1}))
    assert restored["restored"] and restored["generation"] == 2
    assert restored["withdrawn_jobs"] == 1

    server.kill()  # kill -9 after the restore was answered
    server = first_server.restart()
    status = ok(call(server, "GET", "/v1/runs/py"))
    assert status["generation"] == 2 and status["group"] == "g2"
    assert status["progress"]["jobs_done"] == 0
    assert status["counters"]["restores"] == 1
    # Another rank of g2 restoring the same cut: already done, nothing changes.
    again = ok(post(server, "restore", {"group": "g2", "cut": 1}))
    assert not again["restored"] and again["generation"] == 2
    # The old group is fenced off, also its completion of a voided lease.
    code, stale = post(server, "complete", {"worker": w, "group": "g1",
                                            "lease": partial["lease"], "loss": 1, "samples": 8})
    assert code == 409 and stale["error"]["code"] == "stale_generation"
    # g2 gets the partly trained job's last batch, then the withdrawn job whole.
    first = ok(post(server, "acquire", {"worker": w2["worker"], "group": "g2"}))["job"]
    assert first["index"] == partial["index"]
    assert first["batches"] == partial["batches"][1:]
    second = ok(post(server, "acquire", {"worker": w2["worker"], "group": "g2"}))["job"]
    assert second["index"] == later["index"] and second["batches"] == later["batches"]
