"""A coordinator that is gone costs the log a bounded number of lines, not one per retry."""
import logging

import pytest

import traincoord
from traincoord.client import _RetryLog


def retry_lines(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "traincoord" and "retrying in" in r.getMessage()]


def test_a_port_nobody_listens_on_is_said_once_not_per_retry(caplog):
    # 3 s of first contact is at least 5 retries (backoff 0.1 s doubling, full jitter): one
    # line for the first failure, none for the others (a line at most every 10 s).
    with caplog.at_level(logging.WARNING, logger="traincoord"):
        with pytest.raises(traincoord.Unreachable, match="connection refused"):
            traincoord.Run("http://127.0.0.1:9", "r", first_contact_timeout=3.0)
    lines = retry_lines(caplog)
    assert len(lines) == 1, lines
    assert "http://127.0.0.1:9" in lines[0]


def test_an_outage_is_said_at_most_once_per_interval_with_the_retries_it_stands_for(caplog):
    said = _RetryLog()
    with caplog.at_level(logging.WARNING, logger="traincoord"):
        for now in (100.0, 100.5, 101.0, 105.0, 110.0, 110.5, 119.9, 120.0):
            said.retry(now, "GET %s: refused", "http://x")
        said.succeeded()  # the coordinator answered: the next outage is said at once
        said.retry(121.0, "GET %s: refused", "http://x")
    assert retry_lines(caplog) == []  # (the message is the caller's; here without "retrying in")
    lines = [r.getMessage() for r in caplog.records if r.name == "traincoord"]
    assert lines == [
        "GET http://x: refused",
        "GET http://x: refused (3 more retries since the last line)",
        "GET http://x: refused (2 more retries since the last line)",
        "GET http://x: refused",
    ]
