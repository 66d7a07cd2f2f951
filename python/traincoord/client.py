"""The traincoord client: a run, its jobs, heartbeats and retries (docs/PYTHON.md)."""

from __future__ import annotations

import atexit
import collections
import http.client
import io
import json
import logging
import math
import os
import random
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

log = logging.getLogger("traincoord")


# Error codes a program acts on (docs/API.md lists every code, when, and what to do): decide on
# CoordinatorError.code, never on its message.
RUN_NOT_FOUND = "run_not_found"
WORKER_NOT_REGISTERED = "worker_not_registered"  # the coordinator forgot us: register again
LEASE_UNKNOWN = "lease_unknown"  # a lease the coordinator never issued (or forgot)
LEASE_NOT_YOURS = "lease_not_yours"
BAD_REPLY = "bad_reply"  # (the client's own) a reply without a field it must have, or too big
# Checkpoint cuts and groups (docs/PYTHON.md, "Checkpoints: state_dict and restore").
STALE_GENERATION = "stale_generation"  # a newer group took the run over: stop this process
RESTORE_REQUIRED = "restore_required"  # the run has cuts: restore one (or start fresh) first
RESTORE_CONFLICT = "restore_conflict"  # the current group restored another target already
GROUP_MISMATCH = "group_mismatch"  # a request named another group than its worker registered with
CUT_NOT_FOUND = "cut_not_found"
CUT_INCOMPLETE = "cut_incomplete"  # not every rank gave its share (yet)
CUT_MISMATCH = "cut_mismatch"  # ranks disagree on the cut's world size
LEASE_NOT_HELD = "lease_not_held"  # a cut part names a lease that is not live any more
# High availability (docs/PYTHON.md, "Several coordinators"): 421 from a coordinator that does
# not lead the run. The client follows it on its own; a program meets it only when no
# coordinator led the run within give_up_after.
NOT_LEADER = "not_leader"
# The coordinator restarted without its state and no longer knows the worker or the lease: a
# completion is lost and its job will be handed out again.
_FORGOTTEN = (WORKER_NOT_REGISTERED, LEASE_UNKNOWN)

# The largest reply the client reads (Run(max_reply_bytes=...)): a longer one is refused with
# BadReply before it is read whole. A run's status grows with its epochs and workers.
MAX_REPLY_BYTES = 64 << 20
# The coordinator says how often to heartbeat (heartbeat_interval_ms); the client keeps it
# within these bounds, so that a coordinator cannot make it send heartbeats in a busy loop.
HEARTBEAT_INTERVAL_MIN_S = 0.1
HEARTBEAT_INTERVAL_MAX_S = 60.0
# The longest a JobFeed holds a queued completion before sending it without a full group:
# what the coordinator hears of a rank (losses, batch times, progress) lags by at most this.
REPORT_DELAY_MAX_S = 1.0
# Jobs a JobFeed holds ahead while the coordinator says their epoch is warming up (its
# `warming_up`: docs/API.md), beyond the one its consumer took last.
WARMING_UP_DEPTH = 2


class CoordinatorError(Exception):
    """The coordinator refused a request (HTTP 4xx), or could not be reached (Unreachable).

    ``code`` is what a program decides on: the coordinator's error code (``run_not_found``,
    ``worker_not_registered``, ``lease_unknown``, ``lease_not_yours``, ``invalid_argument``, ...;
    docs/API.md), or the client's own ``unreachable`` or ``tls``. ``status`` is the HTTP status
    (0: no answer), ``field`` the offending request field, ``message`` for people."""

    def __init__(self, message: str, status: int = 0, code: str = "", field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field


class BadReply(CoordinatorError):
    """A reply the client cannot use (code ``bad_reply``): not JSON, nested too deep, larger
    than ``max_reply_bytes``, or lacking a field or holding one of another type. The message
    names the request and the field."""

    def __init__(self, message: str, status: int = 200) -> None:
        super().__init__(message, status, BAD_REPLY)


class _Reply(dict):
    """A reply's JSON object: a field it lacks raises BadReply (code="bad_reply") naming the
    request and the field, instead of a bare KeyError (a coordinator of another version, or
    something else listening at the URL). _field() reads a field of a given type."""

    def __init__(self, fields: dict, where: str) -> None:
        super().__init__(fields)
        self._where = where
        self._path = ""

    def __missing__(self, key: str) -> Any:
        raise BadReply(f"the reply to {self._where} lacks field {_join(self._path, key)!r} (is "
                       f"the coordinator of another version?): {_show(self)}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    """A short picture of a value for a message (never the whole of a large one)."""
    text = json.dumps(value) if not isinstance(value, (dict, list)) or len(value) < 50 else ""
    return text[:200] if text else f"a {type(value).__name__} of {len(value)} items"


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
}


def _field(reply: Mapping[str, Any], key: str, kind: str, optional: bool = False) -> Any:
    """reply[key], checked to be of `kind` ("int", "number", "str", "bool", "object", "list");
    raises BadReply naming the request and the field otherwise. optional: absent or null is
    None. An object read this way knows its path, for the messages of its own fields."""
    where = getattr(reply, "_where", "a request")
    name = _join(getattr(reply, "_path", ""), key)
    if not isinstance(reply, dict):
        raise BadReply(f"the reply to {where} has {name.rsplit('.', 1)[0]!r} that is not an "
                       f"object: {_show(reply)}")
    if key not in reply or (optional and reply[key] is None):
        if optional:
            return None
        raise BadReply(f"the reply to {where} lacks field {name!r} (is the coordinator of "
                       f"another version?): {_show(reply)}")
    value = reply[key]
    check, expected = _KINDS[kind]
    if not check(value):
        raise BadReply(f"the reply to {where} has field {name!r} that is not {expected}: "
                       f"{_show(value)}")
    if isinstance(value, _Reply):
        value._path = name
    return value


def _objects(reply: Mapping[str, Any], key: str) -> list[Any]:
    """reply[key], a list of objects (each knows its path, "jobs[2]")."""
    items = _field(reply, key, "list")
    name = _join(getattr(reply, "_path", ""), key)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadReply(f"the reply to {getattr(reply, '_where', 'a request')} has field "
                           f"'{name}[{i}]' that is not an object: {_show(item)}")
        if isinstance(item, _Reply):
            item._path = f"{name}[{i}]"
    return items


def _parse_reply(data: bytes, where: str) -> Any:
    try:
        reply = json.loads(data, object_hook=lambda fields: _Reply(fields, where)) if data else {}
    except RecursionError:
        raise BadReply(f"the reply to {where} is nested too deep to read "
                       f"({len(data)} bytes)") from None
    except (ValueError, UnicodeDecodeError):
        reply = None
    if not isinstance(reply, dict):
        raise BadReply(f"the reply to {where} is not a JSON object: "
                       f"{data[:200].decode(errors='replace')}")
    return reply


def _refusal(method: str, path: str, status: int, reason: str, location: str | None,
             data: bytes) -> CoordinatorError:
    """The error a reply of status 3xx or 4xx carries: the coordinator's {"error": {"code",
    "message", "field"}}, or, when the body is not that (a proxy, a redirect, another server),
    the code http_STATUS with a message naming the request and what came back."""
    try:
        reply = json.loads(data) if data else {}
    except (ValueError, UnicodeDecodeError, RecursionError):
        reply = {}
    err = reply.get("error") if isinstance(reply, dict) else None
    err = err if isinstance(err, dict) else {}
    code, text, field_name = (err.get(k) for k in ("code", "message", "field"))
    code = code if isinstance(code, str) and code else f"http_{status}"
    field_name = field_name if isinstance(field_name, str) else ""
    if isinstance(text, str) and text:
        return CoordinatorError(text, status, code, field_name)
    message = f"{method} {path} was answered HTTP {status} {reason}".rstrip()
    if location:
        message += f", to {location[:200]} (the client follows no redirects: give the " \
                   "coordinator's own URL)"
    body = data[:200].decode(errors="replace")
    if body:
        message += f": {body}"
    return CoordinatorError(message, status, code, field_name)


class Unreachable(CoordinatorError):
    """The coordinator did not answer for ``give_up_after`` seconds."""


@dataclass(frozen=True)
class Finished:
    """How a run ended: state is completed, early_stopped, cancelled or failed."""

    state: str
    reason: str


@dataclass
class Job:
    """A job handed to this worker: train (or evaluate, for set == "dev") its batches."""

    lease: int
    attempt: int
    set: str
    epoch: int
    index: int
    jobs_in_epoch: int
    batches: list[int]
    # Step mode (schedule.mode = "steps"): this rank's batch of step `step` of `steps`, its
    # sample indices listed in `samples` (then `batches` is empty), and the factor to scale
    # its loss by so that the step's gradient is the mean over the step's samples under DDP's
    # averaging (n_rank * world_size / n_step). None / 1.0 in job mode.
    samples: list[int] | None = field(default=None, compare=False)
    rank: int | None = field(default=None, compare=False)
    step: int | None = field(default=None, compare=False)
    steps: int | None = field(default=None, compare=False)
    loss_scale: float = field(default=1.0, compare=False)
    _run: "Run | None" = field(default=None, repr=False, compare=False)
    _result: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _sent: bool = field(default=False, repr=False, compare=False)
    _samples: Any = field(default=None, repr=False, compare=False)  # set by a feed's prepare
    outcome: str | None = field(default=None, compare=False)

    def complete(self, loss: float, samples: int = 0, **metrics: float) -> None:
        """Reports the job done. Inside ``Run.jobs()`` the report travels with the request for
        the next job (one round trip per job); elsewhere it is sent at once."""
        if self._result is not None:
            raise RuntimeError(f"job {self.index} of {self.set} epoch {self.epoch} completed twice")
        self._result = {"loss": _json_number(loss), "samples": int(samples)}
        if metrics:
            self._result["metrics"] = {k: _json_number(v) for k, v in metrics.items()}
        if self._run is not None and not self._run._in_loop(self):
            self._run._complete(self)

    def fail(self, reason: str) -> None:
        """Gives the job back as failed (a failed attempt; another worker will retry it)."""
        if self._run is None:
            raise RuntimeError("this job has no run")
        self._result = {"failed": reason}
        self._run._fail(self, reason)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is not None and self._result is None:
            self.fail(f"{kind.__name__}: {value}")
        return False


def _token_from_environment() -> str:
    if os.environ.get("TRAINCOORD_TOKEN"):
        return os.environ["TRAINCOORD_TOKEN"]
    if os.environ.get("TRAINCOORD_TOKEN_FILE"):
        with open(os.environ["TRAINCOORD_TOKEN_FILE"]) as f:
            return f.readline().strip()
    return ""


def _tls_context(ca_file: str | None, cert_file: str | None,
                 key_file: str | None) -> ssl.SSLContext:
    """Verifies the coordinator against ca_file (else the system's CAs) and its host name;
    shows cert_file/key_file to a coordinator that asks for a client certificate. Each
    defaults to $TRAINCOORD_CA_FILE, $TRAINCOORD_CERT_FILE, $TRAINCOORD_KEY_FILE."""
    ca_file = ca_file or os.environ.get("TRAINCOORD_CA_FILE") or None
    cert_file = cert_file or os.environ.get("TRAINCOORD_CERT_FILE") or None
    key_file = key_file or os.environ.get("TRAINCOORD_KEY_FILE") or None
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            raise CoordinatorError(f"cannot use client certificate {cert_file}: {e}",
                                   code="invalid_argument", field="cert_file") from None
    return context


def _request_id() -> int:
    return random.getrandbits(52) | 1  # nonzero; exact in JSON doubles too


def _json_number(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None  # a non-finite loss travels as null


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read given only the time left before the request's deadline: a
    reply dripped a byte at a time, or interim replies without end, stop at the deadline."""

    def __init__(self, sock: socket.socket, deadline: float, what: str) -> None:
        super().__init__()
        self._sock, self._deadline, self._what = sock, deadline, what

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(self._what)
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        except socket.timeout:
            raise TimeoutError(self._what) from None


class _DeadlineSocket:
    """What http.client.HTTPResponse reads a reply from: the socket, under a deadline."""

    def __init__(self, sock: socket.socket, deadline: float, what: str) -> None:
        self._reader = _DeadlineReader(sock, deadline, what)

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(self._reader)


class _Connection:
    """One keep-alive HTTP connection with timeouts; reopened after any failure. A request
    gets its whole reply within its timeout (a total deadline, not one per read), and at most
    max_reply_bytes of it."""

    def __init__(self, host: str, port: int, timeout: float, token: str = "",
                 tls: ssl.SSLContext | None = None, max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.token, self.tls = token, tls
        self.max_reply_bytes = max_reply_bytes
        self.conn: http.client.HTTPConnection | None = None
        self.give_up_after: float | None = None  # overrides the run's (e.g. while closing)
        self.reason = ""  # of the last reply: its reason phrase and Location header
        self.location: str | None = None
        # ... and its Traincoord-Term header (several coordinators; None from a single one)
        self.term: str | None = None

    def request(self, method: str, path: str, body: Any,
                timeout: float) -> tuple[int, bytes | bytearray]:
        """(status, body) of one request: raises TimeoutError when the whole reply has not
        come within `timeout` seconds, BadReply when it is larger than max_reply_bytes."""
        data = json.dumps(body).encode() if body is not None else None
        deadline = time.monotonic() + timeout
        what = (f"no complete reply to {method} {path} from {self.host}:{self.port} within "
                f"the request's deadline of {timeout:g} s")

        def response_class(sock: socket.socket, *args: Any, **kwargs: Any) -> Any:
            return http.client.HTTPResponse(_DeadlineSocket(sock, deadline, what), *args,
                                            **kwargs)
        for attempt in range(2):  # a kept-alive connection may have been closed by the server
            if self.conn is None:
                if self.tls is not None:
                    conn = http.client.HTTPSConnection(self.host, self.port,
                                                       timeout=self.timeout, context=self.tls)
                else:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                try:
                    conn.connect()  # raises OSError: the caller retries
                except ssl.SSLCertVerificationError as e:  # retrying will not help
                    raise CoordinatorError(f"TLS: the coordinator at {self.host}:{self.port} "
                                           f"did not verify: {e.verify_message}",
                                           code="tls") from None
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.conn = conn
            self.conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
            self.conn.response_class = response_class
            try:
                headers = {"Content-Type": "application/json"} if data is not None else {}
                if self.token:
                    headers["Authorization"] = f"Bearer {self.token}"
                self.conn.request(method, path, body=data, headers=headers)
                response = self.conn.getresponse()
                self.reason, self.location = response.reason, response.getheader("Location")
                self.term = response.getheader("Traincoord-Term")
                return response.status, self._read_body(response, method, path)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt == 1:
                    raise
            except Exception:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _read_body(self, response: http.client.HTTPResponse, method: str,
                   path: str) -> bytes | bytearray:
        cap = self.max_reply_bytes
        too_large = (f"the reply to {method} {path} is larger than the client reads "
                     f"({cap / (1 << 20):g} MiB; Run(max_reply_bytes=...) sets it)")
        length = response.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > cap:
            raise BadReply(f"{too_large}: it announces {int(length)} bytes", response.status)
        # In pieces into one buffer: read(cap) of a chunked body would hold it twice.
        data = bytearray()
        while len(data) <= cap:
            piece = response.read(min(1 << 20, cap + 1 - len(data)))
            if not piece:
                return bytes(data) if len(data) < (1 << 20) else data
            data += piece
        raise BadReply(too_large, response.status)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def _split_urls(url: "str | list[str] | tuple[str, ...]") -> list[str]:
    """The coordinator urls of `url`: one, a comma-separated string, or a list (of urls or of
    comma-separated strings); each http(s)://HOST:PORT (or HOST:PORT), without a trailing /."""
    items = [url] if isinstance(url, str) else list(url)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise CoordinatorError(f"url must be a string or a list of strings, got {item!r}",
                                   code="invalid_argument", field="url")
        for one in item.split(","):
            one = one.strip().rstrip("/")
            if not one:
                continue
            parsed = urllib.parse.urlparse(one if "://" in one else "http://" + one)
            try:
                port = parsed.port
            except ValueError:
                port = None
            if parsed.scheme not in ("http", "https") or not port or not parsed.hostname:
                raise CoordinatorError(f"url must be http://HOST:PORT or https://HOST:PORT "
                                       f"(several separated by commas), got {one!r}",
                                       code="invalid_argument", field="url")
            if one not in out:
                out.append(one)
    if not out:
        raise CoordinatorError("no coordinator url given: http://HOST:PORT, or several "
                               "separated by commas", code="invalid_argument", field="url")
    return out


class _RetryLog:
    """The warnings of failed requests, rate-limited: a coordinator that is gone costs the log
    its first failure, then at most one line every ``every`` seconds that counts the retries it
    stands for, not a line per retry. A request that succeeds starts it over (the next outage
    is said at once). Shared by the threads of one run (its requests and heartbeats)."""

    every = 10.0  # seconds between two lines of one outage

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: float | None = None  # when the last line was written; None: no outage
        self._unsaid = 0  # retries since that line

    def retry(self, now: float, message: str, *args: Any) -> None:
        with self._lock:
            if self._last is not None and now - self._last < self.every:
                self._unsaid += 1
                return
            unsaid, self._unsaid, self._last = self._unsaid, 0, now
        if unsaid:
            message += f" ({unsaid} more retries since the last line)"
        log.warning(message, *args)

    def succeeded(self) -> None:
        with self._lock:
            self._last, self._unsaid = None, 0


class _Coordinators:
    """The coordinators of one run (docs/PYTHON.md, "Several coordinators"): the urls given and
    the leaders they named, which one is believed to lead, and the highest term
    (Traincoord-Term) seen. Shared by a run's connections (its calls, its feeds, its heartbeats),
    so that what one learns the others use. Thread-safe."""

    MAX_NAMED = 16  # leaders named that were not in the list

    def __init__(self, urls: list[str]) -> None:
        self.urls = list(urls)
        self.leader = 0
        self.term = 0
        self._named = 0
        self._lock = threading.Lock()

    def failed(self, i: int) -> None:
        """Coordinator i did not do: the next one (round robin), unless another thread moved."""
        with self._lock:
            if self.leader == i:
                self.leader = (i + 1) % len(self.urls)

    def index_of(self, url: str) -> int | None:
        """The index of a leader a coordinator named (added when new); None for a url that is
        not http(s)://HOST:PORT, or when too many were named."""
        url = url.rstrip("/")
        with self._lock:
            if url in self.urls:
                return self.urls.index(url)
            try:
                _split_urls(url)
            except CoordinatorError:
                return None
            if self._named >= self.MAX_NAMED:
                return None
            self._named += 1
            self.urls.append(url)
            return len(self.urls) - 1

    def note_term(self, term: int | None) -> bool:
        """Notes a reply's term: False when it is older than one seen (a deposed leader's)."""
        if term is None:
            return True
        with self._lock:
            if term < self.term:
                return False
            self.term = term
            return True


class _Channel:
    """A connection to each coordinator of a run, for one thread, made on first use."""

    def __init__(self, coordinators: _Coordinators, timeout: float, token: str,
                 tls: "Callable[[], ssl.SSLContext]", max_reply_bytes: int) -> None:
        self.coordinators = coordinators
        self.timeout, self.token, self._tls = timeout, token, tls
        self.max_reply_bytes = max_reply_bytes
        self.give_up_after: float | None = None  # overrides the run's (e.g. while closing)
        self._connections: dict[str, _Connection] = {}

    def to(self, url: str) -> "_Connection":
        conn = self._connections.get(url)
        if conn is None:
            parsed = urllib.parse.urlparse(url if "://" in url else "http://" + url)
            tls = self._tls() if parsed.scheme == "https" else None
            conn = _Connection(parsed.hostname, parsed.port, self.timeout, self.token, tls,
                               self.max_reply_bytes)
            self._connections[url] = conn
        return conn

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()


def _term_of(value: str | None) -> int | None:
    """A Traincoord-Term header: its integer, or None (absent: a single coordinator)."""
    if value is None or not value.strip().isdigit():
        return None
    return int(value.strip())


def _not_leader(status: int, data: bytes) -> dict[str, Any] | None:
    """The error object of a 421 not_leader answer, or None for any other reply."""
    if status != 421:
        return None
    try:
        reply = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    err = reply.get("error") if isinstance(reply, dict) else None
    if not isinstance(err, dict) or err.get("code") != NOT_LEADER:
        return None
    return err


# not_leader answers naming a leader followed in a row before backing off (two coordinators that
# name each other must not make the client spin).
_MAX_HOPS = 3


class Run:
    """A worker of one run on a coordinator: registers on construction.

    url: the coordinator (http://HOST:PORT, or https://HOST:PORT for TLS); or several
    coordinators (high availability): a list of urls, or one string of urls separated by commas
    (docs/PYTHON.md, "Several coordinators"). run: the run's name; worker: a stable name
    (default HOSTNAME-PID). timeout: seconds for one request; long_poll: seconds the server may
    hold an acquire while there is no job; give_up_after: seconds of failure before
    Unreachable; heartbeats: extend leases from a background thread; token: the run's worker
    token when the coordinator needs one (default: $TRAINCOORD_TOKEN, or the file named by
    $TRAINCOORD_TOKEN_FILE). ca_file, cert_file, key_file: for https, the CA that signed the
    coordinator's certificate (default: $TRAINCOORD_CA_FILE, else the system's CAs) and this
    worker's own certificate for a coordinator that requires one ($TRAINCOORD_CERT_FILE,
    $TRAINCOORD_KEY_FILE). jobs_per_request: how many jobs ``jobs()`` takes in one request
    (1 to 64); with N > 1 the loop yields them one after the other and reports their
    completions together with the request for the next N, so a small job costs 1/N of a round
    trip (its loss reaches the coordinator up to N - 1 jobs later). first_contact_timeout:
    seconds to keep trying before the coordinator has answered once (a wrong host name or a
    refused connection fails within these seconds with a clear message; give_up_after applies
    once it has answered, e.g. across its restart). group: the group (one start of a training
    job: its ranks) this worker belongs to, sent on every request; a newer group of the run
    fences this one off (``stale_generation``). None: ungrouped, never fenced (independent
    workers); ``traincoord.torch.Phases`` sets it (``set_group``). max_reply_bytes: the largest
    reply read (default MAX_REPLY_BYTES, 64 MiB); a larger one is a BadReply.

    Every request gets its whole reply within ``timeout`` seconds (plus ``long_poll`` for an
    acquire that may wait): a total deadline, not one per read. A reply the client cannot use
    (not JSON, a field missing or of another type, too large) raises BadReply naming the
    request and the field; a redirect or an error without the coordinator's error object
    raises CoordinatorError with the code ``http_STATUS``.

    Failed requests are retried with a warning on the ``logging.getLogger("traincoord")``
    logger (the URL and the error): the first failure of an outage at once, then at most one
    line every 10 seconds, counting the retries since the last one.
    """

    def __init__(self, url: "str | list[str]", run: str, worker: str | None = None, *,
                 timeout: float = 30.0,
                 long_poll: float = 20.0, give_up_after: float = 300.0,
                 heartbeats: bool = True, token: str | None = None, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None,
                 jobs_per_request: int = 1, first_contact_timeout: float = 10.0,
                 group: str | None = None, max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        urls = _split_urls(url)
        if not 1 <= jobs_per_request <= 64:
            raise CoordinatorError(f"jobs_per_request must be 1 to 64, got {jobs_per_request}",
                                   field="jobs_per_request")
        self.jobs_per_request = jobs_per_request
        # self.url: the coordinators' urls as one string ("http://a:8470,http://b:8470").
        self.url, self.urls, self.run = ",".join(urls), urls, run
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}"
        self.timeout, self.long_poll, self.give_up_after = timeout, long_poll, give_up_after
        self.first_contact_timeout = first_contact_timeout
        self._reached = False  # whether the coordinator has answered this client once
        self._retry_log = _RetryLog()
        self._feeds: list[JobFeed] = []
        self._pid = os.getpid()
        self._token = token if token is not None else _token_from_environment()
        self._tls_files = (ca_file, cert_file, key_file)
        self._tls: ssl.SSLContext | None = None
        if any(u.startswith("https://") for u in urls):
            self._tls_context()  # a bad CA or certificate file is said at once
        self.max_reply_bytes = max_reply_bytes
        self._coordinators = _Coordinators(urls)
        self._conn = self._channel()
        self._lock = threading.Lock()
        self._held = _HeldLeases()
        self._current: Job | None = None
        self.finished: Finished | None = None
        self.id = -1
        self.heartbeat_interval = 10.0
        self.group: str | None = group or None
        self.rank: int | None = None  # set_rank: its rank in the group, and the group's size
        self.world_size: int | None = None
        # What the last registration said: "current" or "restore_required" (None: ungrouped),
        # the run's generation and its latest complete cut (or None).
        self.group_state: str | None = None
        self.generation = 0
        self.latest_cut: int | None = None
        self._register()
        self._stop = threading.Event()
        self._heartbeats = None
        if heartbeats:
            self._heartbeats = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                                name=f"traincoord-heartbeat-{self.worker}")
            self._heartbeats.start()
        _open_runs.add(self)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = _tls_context(*self._tls_files)
        return self._tls

    def _channel(self) -> _Channel:
        """Connections of their own to the coordinators (one thread's)."""
        return _Channel(self._coordinators, self.timeout, self._token, self._tls_context,
                        self.max_reply_bytes)

    @property
    def leader(self) -> str:
        """The url of the coordinator this worker believes leads the run (its last answer)."""
        return self._coordinators.urls[self._coordinators.leader]

    @classmethod
    def from_env(cls, **kwargs: Any) -> "Run":
        """The run that ``traincoord launch`` (or the user) describes in the environment:
        TRAINCOORD_URL (one url, or several separated by commas), TRAINCOORD_RUN and
        TRAINCOORD_WORKER, and the group of this start of the workers, TRAINCOORD_GROUP
        (``launch`` sets a new one for each restart of the group; unset: ungrouped)."""
        try:
            url, run = os.environ["TRAINCOORD_URL"], os.environ["TRAINCOORD_RUN"]
        except KeyError as missing:
            script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "train.py"
            raise CoordinatorError(
                f"environment variable {missing.args[0]} is not set: start this script with "
                f"`traincoord launch --config RUN.toml -- python3 {script}` (it sets "
                "TRAINCOORD_URL, TRAINCOORD_RUN and the rank's variables), or point it at a "
                "running coordinator: TRAINCOORD_URL=http://HOST:8470 TRAINCOORD_RUN=RUN "
                f"python3 {script}") from None
        if os.environ.get("TRAINCOORD_GROUP") and "group" not in kwargs:
            kwargs["group"] = os.environ["TRAINCOORD_GROUP"]
        return cls(url, run, os.environ.get("TRAINCOORD_WORKER"), **kwargs)

    # ---- the loop -------------------------------------------------------------------------

    def jobs(self, stop_at_wait: bool = False, prefetch: int = 0) -> Iterator[Job]:
        """Yields jobs until the run is finished (then ``self.finished`` says how). Complete
        (or fail) each job before asking for the next. With stop_at_wait, the loop also ends
        when the coordinator has no job right now (an epoch barrier) instead of waiting.
        With prefetch=N (1 to 64), a JobFeed keeps N jobs fetched ahead and sends completions
        behind on a thread of its own: the loop never waits for a round trip between jobs, and
        job.outcome is set once the completion was sent. Jobs fetched ahead and not yielded go
        back when the loop ends."""
        if prefetch:
            yield from self._jobs_fed(stop_at_wait, prefetch)
            return
        if self.jobs_per_request > 1:
            yield from self._jobs_in_groups(wait=not stop_at_wait)
            return
        job = self.next_job(wait=not stop_at_wait)
        while job is not None:
            yield from self._hand_over(job)
            if "failed" in job._result:
                job = self.next_job(wait=not stop_at_wait)
            else:
                job = self._complete(job, next_job=True, wait=not stop_at_wait)

    def _jobs_fed(self, stop_at_wait: bool, depth: int) -> Iterator[Job]:
        feed = self.feed(depth)
        try:
            while True:
                job = feed.head() if stop_at_wait else (feed.head() or feed.wait())
                if job is None:
                    feed.flush()
                    return
                feed.pop()
                yield from self._hand_over(job)
                if "failed" not in job._result:
                    feed.complete(job)
        finally:
            feed.close()
            self._feeds.remove(feed)

    def _hand_over(self, job: Job) -> Iterator[Job]:
        """Yields `job` to the loop's body, which must complete or fail it."""
        self._current = job
        try:
            yield job
        finally:
            self._current = None
        if job._result is None:
            raise RuntimeError(f"job {job.index} of {job.set} epoch {job.epoch} was neither "
                               "completed nor failed")

    def _jobs_in_groups(self, wait: bool) -> Iterator[Job]:
        group = self._next_group(wait)
        while group:
            done = []
            for job in group:
                yield from self._hand_over(job)
                if "failed" not in job._result:
                    done.append(job)
            group = self._complete_group(done, wait) if done else self._next_group(wait)

    def _next_group(self, wait: bool) -> list[Job]:
        while True:
            reply = self._post("acquire", {"worker": self.id, "request": _request_id(),
                                           "jobs": self.jobs_per_request,
                                           "wait_ms": int(self.long_poll * 1000) if wait else 0},
                               extra=self.long_poll if wait else 0)
            group = self._take_group(reply)
            if group or reply["status"] == "finished" or not wait:
                return group

    def _take_group(self, reply: Mapping[str, Any]) -> list[Job]:
        if _field(reply, "status", "str") != "job":
            self._take(reply)  # finished: say why
            return []
        return [self._take(reply, j) for j in _objects(reply, "jobs")]

    def _complete_group(self, done: list[Job], wait: bool) -> list[Job]:
        for job in done:
            self._drop(job.lease)
        body = {"worker": self.id,
                "completions": [{"lease": job.lease, **job._result} for job in done],
                "next": True, "jobs": self.jobs_per_request, "request": _request_id(),
                "wait_ms": int(self.long_poll * 1000) if wait else 0}
        try:
            reply = self._post("complete", body, extra=self.long_poll if wait else 0)
        except CoordinatorError as e:
            if e.code not in _FORGOTTEN:
                raise
            for job in done:  # the coordinator lost its state; the jobs will be handed out again
                job.outcome = "lost"
            if e.code == WORKER_NOT_REGISTERED:
                self._register()
            return self._next_group(wait)
        for job, outcome in zip(done, _objects(reply, "outcomes")):
            job.outcome = _field(outcome, "outcome", "str")
            job._sent = True
        group = self._take_group(_field(reply, "next", "object"))
        if not group and reply["next"]["status"] == "wait" and wait:
            return self._next_group(wait)
        return group

    def next_job(self, wait: bool = True) -> Job | None:
        """The next job; None when the run is finished, or (wait=False) when there is no job
        right now."""
        while True:
            # One id per logical acquire; its retries (inside _request) carry the same id, so a
            # lost reply gets the same job back instead of stranding it.
            reply = self._post("acquire", {"worker": self.id, "request": _request_id(),
                                           "wait_ms": int(self.long_poll * 1000) if wait else 0},
                               extra=self.long_poll if wait else 0)
            job = self._take(reply)
            if job is not None or reply["status"] == "finished" or not wait:
                return job

    def status(self) -> dict[str, Any]:
        """The run's status (GET /v1/runs/RUN): losses, workers, early stop, ... and the latest
        100 epochs (``epochs_total`` were opened: ``epochs()`` lists them all)."""
        return self._request("GET", f"/v1/runs/{self.run}", None, 0)

    def epochs(self, start: int = 0) -> list[dict[str, Any]]:
        """The epochs opened from position `start` on (0: the first), in opening order, each as
        the status lists it; paged through GET /v1/runs/RUN/epochs."""
        out: list[dict[str, Any]] = []
        while True:
            page = self._request("GET", f"/v1/runs/{self.run}/epochs?from={start + len(out)}",
                                 None, 0)
            out.extend(page["epochs"])
            if not page["epochs"] or start + len(out) >= int(page["epochs_total"]):
                return out

    def series(self, after: int = 0) -> dict[tuple[str, str], list[tuple[int, int, float]]]:
        """The run's series (GET /v1/runs/RUN/series, docs/OBSERVABILITY.md "Series"): every
        counted completion's loss and each metric it reported, per set, over the whole run,
        downsampled by the coordinator: {(set, name): [(n, epoch, value), ...]}, oldest first,
        each series' latest value last. `after`: only the points of completions after the
        n-th."""
        reply = self._request("GET", f"/v1/runs/{self.run}/series?after={int(after)}", None, 0)
        out: dict[tuple[str, str], list[tuple[int, int, float]]] = {}
        for s in _field(reply, "series", "list"):
            points = [tuple(p) for p in s["points"]]
            if s.get("latest") is not None and (not points or points[-1][0] < s["latest"][0]):
                points.append(tuple(s["latest"]))
            out[(s["set"], s["name"])] = points
        return out

    @property
    def early_stop(self) -> dict[str, Any]:
        return self.status()["early_stop"]

    @property
    def best_epoch(self) -> int | None:
        """The epoch whose checkpoint to keep (the best dev result so far)."""
        return self.early_stop["best_epoch"]

    def leave(self) -> None:
        """Leaves the run: held jobs go back at once."""
        self._post("leave", {"worker": self.id})

    def release(self, jobs: "list[Job]") -> int:
        """Hands jobs back untouched (not a failed attempt): another worker will train them,
        and a later completion of theirs is not counted. Returns how many went back."""
        for job in jobs:
            self._drop(job.lease)
        if not jobs:
            return 0
        reply = self._post("release", {"worker": self.id, "leases": [j.lease for j in jobs]})
        return _field(reply, "released", "int")

    # ---- groups, checkpoint cuts and restores (docs/PYTHON.md, "Checkpoints") ---------------

    def set_group(self, group: str | None) -> None:
        """Makes this worker a member of `group` (None: ungrouped) and registers again with it;
        every later request carries it. ``group_state`` then says whether the group is the
        run's current one or must restore a cut first (``restore_required``). Raises
        CoordinatorError(code="stale_generation") for a group the run has left behind."""
        self.group = group or None
        self._register()

    def cut(self, seq: int, rank: int, world_size: int,
            parts: "list[Mapping[str, Any]] | None" = None) -> dict[str, Any]:
        """Gives this rank's share of its group's `seq`-th cut (POST .../cuts): `parts` lists
        the jobs this worker holds that it trained some but not all batches of, each
        ``{"lease", "batches", "loss", "samples", "metrics"}``. Returns the reply: ``cut`` (its
        id), ``complete``, ``ranks`` (those that gave their share), ``world_size``,
        ``generation``. Requires a group."""
        self._require_group("a cut")
        return self._post("cuts", {"worker": self.id, "seq": int(seq), "rank": int(rank),
                                   "world_size": int(world_size), "parts": list(parts or [])})

    def cuts(self) -> dict[str, Any]:
        """The run's cuts (GET .../cuts): ``keep``, ``generation``, ``group`` and ``cuts``
        (oldest first)."""
        return self._request("GET", f"/v1/runs/{self.run}/cuts", None, 0)

    def cut_info(self, cut: int) -> dict[str, Any]:
        """One cut (GET .../cuts/ID); CoordinatorError(code="cut_not_found") when it is not
        kept."""
        return self._request("GET", f"/v1/runs/{self.run}/cuts/{int(cut)}", None, 0)

    def restore(self, cut: int | None = None, fresh: bool = False) -> dict[str, Any]:
        """Makes this worker's group the run's current one (POST .../restore), and puts the run
        back as of `cut`, or (fresh=True) goes on from the ledger as it is. Every lease out is
        void afterwards. Returns the reply: ``restored`` (false when the group restored this
        target already, e.g. from another rank), ``cut``, ``generation``, ``withdrawn_jobs``,
        ``state``. Requires a group."""
        if (cut is None) == (not fresh):
            raise ValueError("restore needs a cut or fresh=True, one of the two")
        self._require_group("a restore")
        body: dict[str, Any] = {"group": self.group}
        if fresh:
            body["fresh"] = True
        else:
            body["cut"] = int(cut)
        reply = self._request("POST", f"/v1/runs/{self.run}/restore", body, 0)
        with self._lock:
            self._held.clear()  # voided
        self.group_state = "current"
        self.generation = _field(reply, "generation", "int")
        return reply

    def _require_group(self, what: str) -> None:
        if not self.group:
            raise CoordinatorError(f"{what} is made by a group, and worker {self.worker} has "
                                   "none: pass Run(group=...) or call set_group() first",
                                   code="invalid_argument", field="group")

    def feed(self, depth: int = 2, prepare: "Callable[[Job], None] | None" = None,
             before_close: "Callable[[], None] | None" = None,
             per_request: int | None = None, warm_start: bool = False) -> "JobFeed":
        """A background thread that keeps `depth` jobs fetched ahead of the caller and sends
        completions without blocking it (docs/PYTHON.md, "Prefetch"). `prepare(job)` runs on
        that thread for each job as it arrives (e.g. to compute its samples); `before_close()`
        runs first thing in its close(). per_request: jobs fetched, and completions sent, per
        round trip (1 to depth; default depth / 2). While the coordinator says the jobs' epoch
        is warming up (docs/API.md, `warming_up`), it holds at most WARMING_UP_DEPTH jobs and
        sends each completion at once; warm_start: so from the first fetch, until a reply says
        otherwise (a cost-balanced run, whose first epoch warms up)."""
        feed = JobFeed(self, depth, prepare, before_close, per_request, warm_start)
        self._feeds.append(feed)
        return feed

    def close(self) -> None:
        """Gives back the jobs fetched ahead and not trained, sends the completions still
        queued, and stops the background threads. Idempotent."""
        for feed in self._feeds:
            feed.close()
        self._feeds.clear()
        _open_runs.discard(self)
        self._stop.set()
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=self.timeout)
        self._conn.close()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- internals ------------------------------------------------------------------------

    def _in_loop(self, job: Job) -> bool:
        return self._current is job

    def set_rank(self, rank: int, world_size: int) -> None:
        """Registers again as rank `rank` of a group of `world_size` ranks (a step-mode run
        hands this worker only its rank's batches; every rank of a group must give the same
        world size). Phases does this in step mode. Requires a group."""
        self._require_group("a rank")
        self.rank, self.world_size = int(rank), int(world_size)
        self._register()

    def _register(self, conn: "_Channel | None" = None) -> None:
        body: dict[str, Any] = {"name": self.worker}
        if self.rank is not None:
            body.update({"rank": self.rank, "world_size": self.world_size})
        reply = self._post("workers", body, registering=True, conn=conn)
        worker = _field(reply, "worker", "int")
        interval = _field(reply, "heartbeat_interval_ms", "number") / 1000.0
        group_state = _field(reply, "group_state", "str", optional=True)
        generation = _field(reply, "generation", "int", optional=True) or 0
        latest_cut = _field(reply, "latest_cut", "int", optional=True)
        self.id = worker
        # Bounded: a coordinator asking for 0 ms must not get a busy loop of heartbeats.
        self.heartbeat_interval = min(max(interval, HEARTBEAT_INTERVAL_MIN_S),
                                      HEARTBEAT_INTERVAL_MAX_S)
        self.group_state = group_state if self.group else None
        self.generation = generation
        self.latest_cut = latest_cut

    def _take(self, reply: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> Job | None:
        """The job of an acquire's answer `reply` (or its item `job` of a list), held; None
        for "wait" and "finished" (then self.finished says how)."""
        status = _field(reply, "status", "str")
        if status == "job":
            j = job if job is not None else _field(reply, "job", "object")
            fields = (_field(j, "lease", "int"), _field(j, "attempt", "int"),
                      _field(j, "set", "str"), _field(j, "epoch", "int"),
                      _field(j, "index", "int"), _field(j, "jobs_in_epoch", "int"))
            batches = _field(j, "batches", "list")
            if not all(isinstance(b, int) and not isinstance(b, bool) for b in batches):
                raise BadReply(f"the reply to {getattr(j, '_where', 'a request')} has field "
                               f"{_join(getattr(j, '_path', ''), 'batches')!r} that holds a "
                               f"value that is not a batch number: {_show(batches)}")
            job = Job(*fields, list(batches), _run=self)
            if "samples" in j:
                samples = _field(j, "samples", "list")
                if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                           for s in samples):
                    raise BadReply(f"the reply to {getattr(j, '_where', 'a request')} has "
                                   f"field {_join(getattr(j, '_path', ''), 'samples')!r} that "
                                   f"holds a value that is not a sample index: {_show(samples)}")
                job.samples = list(samples)
                job.rank = _field(j, "rank", "int")
                job.step = _field(j, "step", "int")
                job.steps = _field(j, "steps", "int")
                job.loss_scale = float(_field(j, "loss_scale", "number"))
            with self._lock:
                self._held.hold(job.lease, time.monotonic())
            return job
        if status == "finished":
            self.finished = Finished(_field(reply, "state", "str"), _field(reply, "reason", "str"))
        elif status != "wait":
            raise BadReply(f"the reply to {getattr(reply, '_where', 'a request')} has field "
                           f"{_join(getattr(reply, '_path', ''), 'status')!r} with the unknown "
                           f"value {status[:64]!r}")
        return None

    def _drop(self, lease: int) -> None:
        with self._lock:
            self._held.drop(lease)

    def _complete(self, job: Job, next_job: bool = False, wait: bool = True) -> Job | None:
        self._drop(job.lease)
        body = {"worker": self.id, "lease": job.lease, **job._result}
        if next_job:
            body.update({"next": True, "wait_ms": int(self.long_poll * 1000) if wait else 0,
                         "request": _request_id()})
        try:
            reply = self._post("complete", body, extra=self.long_poll if next_job and wait else 0)
        except CoordinatorError as e:
            if e.code not in _FORGOTTEN:
                raise
            # The coordinator restarted without its state and no longer knows the lease; the
            # job will be handed out again.
            job.outcome = "lost"
            if e.code == WORKER_NOT_REGISTERED:
                self._register()
            return self.next_job(wait=wait) if next_job else None
        job.outcome = _field(reply, "outcome", "str")
        job._sent = True
        if not next_job:
            return None
        nxt = self._take(_field(reply, "next", "object"))
        if nxt is None and reply["next"]["status"] == "wait" and wait:
            return self.next_job(wait=True)
        return nxt

    def _fail(self, job: Job, reason: str) -> None:
        self._drop(job.lease)
        self._post("fail", {"worker": self.id, "lease": job.lease, "reason": reason[:1000]})

    def _post(self, action: str, body: dict[str, Any], extra: float = 0,
              registering: bool = False, conn: "_Channel | None" = None) -> dict[str, Any]:
        if self.group:
            body = {**body, "group": self.group}
        try:
            return self._request("POST", f"/v1/runs/{self.run}/{action}", body, extra, conn)
        except CoordinatorError as e:
            if not registering and e.code == WORKER_NOT_REGISTERED and action != "complete":
                self._register(conn)  # the coordinator restarted without our registration
                body = {**body, "worker": self.id}
                return self._request("POST", f"/v1/runs/{self.run}/{action}", body, extra, conn)
            raise

    def _request(self, method: str, path: str, body: Any, extra: float,
                 conn: "_Channel | None" = None, one_round: bool = False) -> dict[str, Any]:
        """One request to the coordinator believed to lead the run, retried with exponential
        backoff and full jitter while no coordinator does, for at most give_up_after seconds
        (first_contact_timeout before a coordinator has answered this client once). With several
        coordinators (docs/PYTHON.md, "Several coordinators"): a not_leader answer naming the
        leader is retried there at once; one naming none, after its retry_after_ms, at the next
        url; no answer, or an answer of an older term than one seen (a deposed leader's,
        ignored), at the next url at once, and after a backoff once every url failed in a row;
        a 5xx at the same coordinator after a backoff. The same body every time: its request
        id makes the retries idempotent. The retries are logged as _RetryLog says. one_round: give up once
        every url failed once, without waiting (heartbeats)."""
        conn = conn or self._conn
        co = conn.coordinators
        failing_since = None
        backoff = 0.1
        tried: dict[str, str] = {}  # each url tried: its last error
        failed_in_a_row = hops = 0
        last = ""
        while True:
            attempt_started = time.monotonic()
            at = co.leader
            url = co.urls[at]
            one = conn.to(url)
            pause = None  # what not_leader asked for; else the backoff
            next_url = False  # move on to the next url without waiting
            try:
                status, data = one.request(method, path, body, self.timeout + extra)
                seen = co.term
                term = _term_of(one.term)
                refused = _not_leader(status, data)
                if not co.note_term(term):
                    last = (f"answered as the leader of term {term}, older than term {seen} "
                            "seen: a deposed leader; its answer was ignored")
                    co.failed(at)
                    next_url = True
                elif refused is not None:
                    self._reached = True
                    leader, leader_term = refused.get("leader"), refused.get("term")
                    to = None
                    if isinstance(leader, str) and leader and co.note_term(
                            leader_term if isinstance(leader_term, int) else None):
                        to = co.index_of(leader)
                    if to is not None and to != at:
                        co.leader = to
                        hops += 1
                        tried[url] = f"not the leader; it named {leader}"
                        if hops <= _MAX_HOPS:
                            continue
                        last = tried[url]
                    else:
                        co.failed(at)
                        wait_ms = refused.get("retry_after_ms")
                        wait_ms = wait_ms if isinstance(wait_ms, int) else 100
                        pause = min(max(wait_ms, 0), 10_000) / 1000.0
                        next_url = True
                        last = (f"HTTP 421 not_leader: "
                                f"{refused.get('message') or 'no leader known'}")
                elif status < 500:
                    self._reached = True
                    if status in (200, 201):
                        self._retry_log.succeeded()
                        return _parse_reply(data, f"{method} {path}")
                    raise _refusal(method, path, status, one.reason, one.location, data)
                else:
                    last = f"HTTP {status}: {data[:200].decode(errors='replace')}"
            except ssl.SSLError as e:
                if isinstance(e, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
                    last = f"{type(e).__name__}: {e}"  # closed mid-way: retried
                    co.failed(at)
                    next_url = True
                else:  # an alert (e.g. no client certificate): retrying will not help
                    raise CoordinatorError(f"TLS: the coordinator at {url} refused the "
                                           f"connection: {e.reason or e}", code="tls") from None
            except socket.gaierror as e:
                last = f"cannot resolve host {one.host!r}: {e.strerror or e}"
                co.failed(at)
                next_url = True
            except ConnectionRefusedError:
                last = f"connection refused by {one.host}:{one.port}"
                co.failed(at)
                next_url = True
            except (OSError, http.client.HTTPException) as e:
                last = f"{type(e).__name__}: {e}"
                co.failed(at)
                next_url = True
            tried[url] = last
            now = time.monotonic()
            failing_since = failing_since or attempt_started  # the first failing attempt began
            window = self.give_up_after if self._reached else self.first_contact_timeout
            if conn.give_up_after is not None:
                window = min(window, conn.give_up_after)
            failed_in_a_row += 1
            if (one_round and failed_in_a_row >= len(co.urls)) or now - failing_since >= window:
                raise self._give_up(tried, last, now - failing_since, refused_only=all(
                    w.startswith("HTTP 421") for w in tried.values()))
            if one_round:
                co.failed(at)
                continue
            if next_url and failed_in_a_row % len(co.urls) != 0:
                continue  # the next url, at once
            hops = 0
            if pause is None:
                pause = random.uniform(backoff / 2, backoff)
                backoff = min(5.0, backoff * 2)
            self._retry_log.retry(now, "%s %s%s: %s; retrying in %.1f s (failing for %.0f s, "
                                  "giving up after %.0f s)", method, url, path, last, pause,
                                  now - failing_since, window)
            time.sleep(pause)

    def _give_up(self, tried: dict[str, str], last: str, failing_for: float,
                 refused_only: bool) -> CoordinatorError:
        """The error of a request given up: names every url tried and what each answered."""
        if len(tried) > 1:
            each = "; ".join(f"{u}: {w}" for u, w in tried.items())
            message = (f"no coordinator of {self.url} led the run or answered for "
                       f"{failing_for:.0f} s; giving up (the last error of each: {each})")
            if not self._reached:
                message += (". Is `traincoord serve` running there, and are the URLs right? "
                            "(first_contact_timeout sets how long to try)")
            return Unreachable(message, code=NOT_LEADER if refused_only else "unreachable")
        if not self._reached:
            return Unreachable(
                f"cannot reach the coordinator at {self.url} ({last}); tried for "
                f"{failing_for:.0f} s. Is `traincoord serve` running there, and "
                "is the URL right? (first_contact_timeout sets how long to try)",
                code="unreachable")
        return Unreachable(f"the coordinator at {self.url} has not answered for "
                           f"{failing_for:.0f} s; giving up (last error: {last})",
                           code=NOT_LEADER if refused_only else "unreachable")

    def _heartbeat_loop(self) -> None:
        # Connections of its own; each heartbeat follows the leader as a call does, within one
        # round over the coordinators, so that leases stay alive across a failover.
        # A heartbeat goes out only when a held lease has gone the interval without being renewed
        # (_HeldLeases): a worker whose jobs take less than the interval sends none.
        conn = self._channel()
        while True:
            with self._lock:
                due = self._held.due(self.heartbeat_interval)
            now = time.monotonic()
            # Looks again at least every interval (a lease held meanwhile is due after that).
            wait = self.heartbeat_interval if due is None else min(max(due - now, 0.0),
                                                                   self.heartbeat_interval)
            if self._stop.wait(wait):
                break
            with self._lock:
                now = time.monotonic()
                due = self._held.due(self.heartbeat_interval)
                if due is None or due > now:
                    continue  # nothing held, or renewed since
                leases = sorted(self._held.renew_all(now))
            try:
                body: dict[str, Any] = {"worker": self.id, "leases": leases}
                if self.group:
                    body["group"] = self.group
                self._request("POST", f"/v1/runs/{self.run}/heartbeat", body,
                              min(self.timeout, self.heartbeat_interval) - self.timeout,
                              conn, one_round=True)
            except (OSError, http.client.HTTPException, CoordinatorError):
                pass  # the next heartbeat may get through in time
        conn.close()


class _HeldLeases:
    """The leases a worker knows it holds, each with when it was last renewed (handed out, or
    listed in a heartbeat that went out), and when a heartbeat is due: an interval after the
    oldest renewal, not every interval whatever the worker did. A worker on jobs shorter than the
    interval gets each lease fresh with its job and sends no heartbeat at all, so that heartbeats
    no longer grow the coordinator's work with the number of workers (docs/PERFORMANCE.md,
    "Many workers"). Pure: the caller gives the time (seconds) and holds the run's lock."""

    def __init__(self) -> None:
        self._renewed: dict[int, float] = {}

    def hold(self, lease: int, now: float) -> None:
        self._renewed[lease] = now

    def drop(self, lease: int) -> None:
        self._renewed.pop(lease, None)

    def clear(self) -> None:
        self._renewed.clear()

    def __iter__(self) -> Iterator[int]:
        return iter(self._renewed)

    def __len__(self) -> int:
        return len(self._renewed)

    def due(self, interval: float) -> float | None:
        """When the next heartbeat is due; None while no lease is held."""
        return min(self._renewed.values()) + interval if self._renewed else None

    def renew_all(self, now: float) -> list[int]:
        """A heartbeat goes out at `now`: every held lease is listed and renewed."""
        for lease in self._renewed:
            self._renewed[lease] = now
        return list(self._renewed)


class JobFeed:
    """Jobs fetched ahead and completions sent behind, on a thread of its own, so the training
    loop never waits for a round trip (``Run.feed``; ``traincoord.torch.Phases`` uses one).

    The thread keeps up to `depth` jobs fetched (each a held lease: heartbeated, and given back
    by ``close``), and sends the completions queued by ``complete`` together with the request
    for the next jobs, `per_request` of each per round trip (default depth / 2). It never
    long-polls while completions are queued, so an epoch barrier that waits on this worker's
    own completions cannot stall. Errors it meets are raised by the next call of the consumer.

    The consumer's calls (head, pop, complete) are bookkeeping under a lock: they wake the
    thread only when it has something to do (a group of completions to send, room for a group
    of jobs, a question), so that a training loop is not interrupted once per batch by a thread
    that finds nothing to do (each wake-up takes the GIL from the loop)."""

    def __init__(self, run: Run, depth: int = 2, prepare: Callable[[Job], None] | None = None,
                 before_close: Callable[[], None] | None = None,
                 per_request: int | None = None, warm_start: bool = False) -> None:
        if not 1 <= depth <= 64:
            raise CoordinatorError(f"depth must be 1 to 64, got {depth}", field="depth")
        if per_request is not None and not 1 <= per_request <= depth:
            raise CoordinatorError(f"per_request must be 1 to depth ({depth}), got {per_request}",
                                   field="per_request")
        self._run, self._depth, self._prepare = run, depth, prepare
        # Jobs fetched, and completions sent, per round trip: the group is asked for while the
        # rest is still ahead of the consumer.
        self._group = per_request if per_request is not None else max(1, depth // 2)
        # While the coordinator says the epoch is warming up (cost-balanced step mode: its plan
        # waits for every rank's first reports, and each step held ahead is kept as planned
        # blind), each completion goes at once and at most WARMING_UP_DEPTH jobs are held.
        self._shape = (self._depth, self._group)
        self._warming = warm_start
        if warm_start:
            self._depth, self._group = min(depth, WARMING_UP_DEPTH), 1
        self._before_close = before_close
        self._conn = run._channel()
        self._cv = threading.Condition()
        self._ready: collections.deque[Job] = collections.deque()
        self._outbox: list[Job] = []
        self._first_queued = 0.0  # time.monotonic() when the oldest in the outbox was queued
        self._releases: list[Job] = []
        self._in_flight = 0  # completions and releases taken by the thread, not yet answered
        self._dry = False  # the last acquire found no job right now
        self._asked = 0  # probes asked by the consumer (a fresh "is there a job now?")
        self._answered = 0
        self._long_poll = False  # the consumer waits for a job, across an epoch barrier
        self._flushing = 0  # callers of flush(): send what is queued now
        self._started = False  # nothing is fetched before the consumer first asks
        # The epoch the last "wait" answer named as open, as (set, epoch), or None.
        self.open_epoch: tuple[str, int] | None = None
        self._epochs_known: int | None = None  # sent with a long poll: see wait()
        self.epochs_opened = 0  # the most epochs the coordinator said it had opened
        self.finished: Finished | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"traincoord-feed-{run.worker}")
        self._thread.start()

    # ---- the consumer's side --------------------------------------------------------------

    def head(self) -> Job | None:
        """The next job without taking it: one fetched ahead, else the coordinator is asked
        (without waiting at a barrier). None when it has none right now, or the run is
        finished (``finished`` then says how)."""
        with self._cv:
            self._raise_error()
            self._started = True
            if not self._ready and self.finished is None:
                self._asked += 1
                asked = self._asked
                self._cv.notify_all()
                self._cv.wait_for(lambda: self._ready or self._answered >= asked
                                  or self._error is not None or self.finished is not None)
                self._raise_error()
            return self._ready[0] if self._ready else None

    def wait(self, until: Callable[[tuple[str, int] | None], bool] | None = None,
             epochs_opened: int | None = None) -> Job | None:
        """Like head(), but waits (long-polling) across epoch barriers: None when the run is
        finished, or when ``until(open_epoch)`` holds for the epoch the coordinator says is
        open — (set, epoch), its last jobs held by other workers — e.g. one this worker has
        not entered yet (the coordinator answers a waiting acquire as soon as an epoch opens;
        `epochs_opened`, the number of epochs the caller knows were opened, makes it answer at
        once when more were)."""
        with self._cv:
            self._raise_error()
            self._started = True
            self._epochs_known = epochs_opened
            while not self._ready and self.finished is None:
                self._long_poll = True  # one long poll; the thread clears it when answered
                self._cv.notify_all()
                self._cv.wait_for(lambda: self._ready or self._error is not None
                                  or self.finished is not None or not self._long_poll)
                self._long_poll = False
                self._raise_error()
                if until is not None and until(self.open_epoch):
                    break
            return self._ready[0] if self._ready else None

    def pop(self) -> Job:
        """Takes the job head() or wait() returned."""
        with self._cv:
            job = self._ready.popleft()
            self._wake()  # room for a group more ahead
            return job

    def complete(self, job: Job, result: dict[str, Any] | None = None) -> None:
        """Queues the job's completion (`result`, or what job.complete() recorded); returns at
        once. job.outcome is set when it is sent."""
        if result is not None:
            if job._result is not None:
                raise RuntimeError(f"job {job.index} of {job.set} epoch {job.epoch} completed "
                                   "twice")
            job._result = result
        elif job._result is None:
            raise RuntimeError(f"job {job.index} of {job.set} epoch {job.epoch} has no result")
        with self._cv:
            self._raise_error()
            self._outbox.append(job)
            if len(self._outbox) == 1:
                self._first_queued = time.monotonic()
            self._wake()

    def release(self, jobs: list[Job]) -> None:
        """Queues jobs to hand back untrained (not a failed attempt); returns at once."""
        with self._cv:
            self._releases.extend(jobs)
            self._cv.notify_all()

    def flush(self) -> None:
        """Sends every queued completion and release now, and waits for their answers."""
        with self._cv:
            self._flushing += 1
            self._cv.notify_all()
            try:
                self._cv.wait_for(lambda: (not self._outbox and not self._releases
                                           and not self._in_flight)
                                  or self._error is not None or not self._thread.is_alive())
            finally:
                self._flushing -= 1
            self._raise_error()

    def close(self) -> None:
        """Hands back the jobs fetched ahead, sends what is queued, stops the thread."""
        if self._before_close is not None and not self._closing:
            self._before_close()
        with self._cv:
            if self._closing:
                return
            self._releases.extend(self._ready)
            self._ready.clear()
            self._closing = True
            # What is left to send is not worth minutes of retries: a lease not given back
            # expires, a completion not sent is trained again.
            self._conn.give_up_after = min(self._run.give_up_after, 10.0)
            self._cv.notify_all()
        self._thread.join(timeout=self._run.timeout + self._run.long_poll)
        if self._thread.is_alive():
            log.warning("the job feed of worker %s did not stop in time; its jobs will be "
                        "handed out again when their leases run out", self._run.worker)
        self._conn.close()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        """REQUIRES: self._cv held. Wakes the thread if it has work now (it waits only when it
        has none, and checks again after every round trip)."""
        if self._has_work():
            self._cv.notify_all()

    # ---- the thread -----------------------------------------------------------------------

    def _has_work(self) -> bool:
        # Jobs are fetched, and completions sent, in groups: one round trip carries several
        # (tiny jobs pay a fraction of it).
        group = self._group
        if self._releases or len(self._outbox) >= group or (self._outbox and self._flushing):
            return True
        if self._outbox and time.monotonic() - self._first_queued >= REPORT_DELAY_MAX_S:
            return True
        if self._closing or self.finished is not None:
            return bool(self._outbox)
        if self._asked > self._answered or self._long_poll:
            return True
        return self._started and not self._dry and len(self._ready) <= self._depth - group

    def _loop(self) -> None:
        run = self._run
        while True:
            with self._cv:
                while not (self._has_work() or self._closing):
                    # Queued completions are sent without a full group once the oldest waited
                    # REPORT_DELAY_MAX_S (checked at least that often: the first completion
                    # queued does not wake the thread).
                    now = time.monotonic()
                    start = self._first_queued if self._outbox else now
                    self._cv.wait(max(0.001, start + REPORT_DELAY_MAX_S - now))
                if not self._has_work():
                    return  # closing, and everything was sent
                releases, self._releases = self._releases, []
                done, self._outbox = self._outbox[:64], self._outbox[64:]
                self._in_flight = len(releases) + len(done)
                asked = self._asked
                stopping = self._closing or self.finished is not None
                need = 0 if stopping else max(0, self._depth - len(self._ready))
                if not stopping and asked > self._answered:
                    need = max(need, 1)
                # After a "wait" (no job for this worker now), ask again only with completions
                # (they may open the next epoch) or for the consumer: not once per completion.
                if self._dry and asked <= self._answered and not self._long_poll and not done:
                    need = 0
                long_poll = self._long_poll and not done and not releases and need > 0
            try:
                jobs, status, warming = self._exchange(releases, done, need, long_poll)
                if self._prepare is not None:
                    for job in jobs:
                        self._prepare(job)
            except BaseException as e:  # handed to the consumer: raised by its next call
                log.warning("worker %s: %s", run.worker, e)
                with self._cv:
                    self._error = e
                    self._in_flight = 0
                    self._cv.notify_all()
                return
            with self._cv:
                if self._closing:  # fetched while closing: straight back
                    self._releases.extend(jobs)
                else:
                    self._ready.extend(jobs)
                if jobs and warming != self._warming:
                    self._warming = warming
                    depth, group = self._shape
                    self._depth, self._group = ((min(depth, WARMING_UP_DEPTH), 1) if warming
                                                else (depth, group))
                self._in_flight = 0
                if need:
                    self._answered = max(self._answered, asked)
                    self._dry = status == "wait" and not jobs
                if long_poll:
                    self._long_poll = False  # answered: wait() asks again if it still waits
                self._cv.notify_all()

    def _exchange(self, releases: list[Job], done: list[Job], need: int,
                  long_poll: bool) -> tuple[list[Job], str, bool]:
        """One round: releases, then completions with the request for `need` jobs (or an
        acquire alone). Returns the jobs handed out, the acquire's status and whether their
        epoch is warming up."""
        run = self._run
        if releases:
            for job in releases:
                run._drop(job.lease)
            try:
                run._post("release", {"worker": run.id, "leases": [j.lease for j in releases]},
                          conn=self._conn)
            except CoordinatorError as e:
                if e.code not in _FORGOTTEN:
                    raise  # else the coordinator lost them already; they go out again anyway
        reply = None
        if done:
            for job in done:
                run._drop(job.lease)
            body: dict[str, Any] = {"worker": run.id,
                                    "completions": [{"lease": j.lease, **j._result} for j in done]}
            if need:
                body.update({"next": True, "jobs": need, "request": _request_id(), "wait_ms": 0})
            try:
                reply = run._post("complete", body, conn=self._conn)
            except CoordinatorError as e:
                if e.code not in _FORGOTTEN:
                    raise
                for job in done:  # the coordinator lost its state: the jobs go out again
                    job.outcome = "lost"
                if e.code == WORKER_NOT_REGISTERED:
                    run._register(self._conn)
            else:
                for job, outcome in zip(done, _objects(reply, "outcomes")):
                    job.outcome = _field(outcome, "outcome", "str")
                    job._sent = True
                reply = _field(reply, "next", "object", optional=True)
        if need and reply is None:
            body = {"worker": run.id, "request": _request_id(), "jobs": need,
                    "wait_ms": int(run.long_poll * 1000) if long_poll else 0}
            if long_poll and self._epochs_known is not None:
                body["epochs_opened"] = self._epochs_known
            reply = run._post("acquire", body, extra=run.long_poll if long_poll else 0,
                              conn=self._conn)
        if reply is None:
            return [], "", False
        opened = _field(reply, "epochs_opened", "int", optional=True)
        self.epochs_opened = max(self.epochs_opened, opened or 0)
        status = _field(reply, "status", "str")
        if status == "finished":
            self.finished = run.finished = Finished(_field(reply, "state", "str"),
                                                    _field(reply, "reason", "str"))
            return [], "finished", False
        if status == "wait":
            open_epoch = _field(reply, "open", "object", optional=True)
            self.open_epoch = ((_field(open_epoch, "set", "str"), _field(open_epoch, "epoch", "int"))
                               if open_epoch else None)
            if self._epochs_known is not None:  # the next long poll waits for a newer epoch
                self._epochs_known = opened if opened is not None else self._epochs_known
        warming = _field(reply, "warming_up", "bool", optional=True) is True
        return run._take_group(reply), status, warming


_open_runs: "weakref.WeakSet[Run]" = weakref.WeakSet()


@atexit.register
def _close_open_runs() -> None:
    """A script that ends (an uncaught exception too) gives back the jobs it fetched ahead
    and sends its queued completions, instead of leaving them to expire."""
    for run in list(_open_runs):
        if run._pid != os.getpid():
            continue  # a forked child (e.g. a DataLoader worker): the parent owns the run
        try:
            run.close()
        except Exception as e:  # the coordinator may be gone; its leases then expire
            log.warning("closing worker %s: %s", run.worker, e)
