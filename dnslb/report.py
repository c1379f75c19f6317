"""Utilization reports: what an agent posts to the manager every second.

A report is a small JSON object (``POST /v1/reports`` with the agent's bearer token)::

    {"server_id": "cache-1", "seq": 42, "time": 1763780000.25,
     "in_progress": 17, "max_concurrency": 100, "cpu": 0.31, "mem": 0.42,
     "served_total": 123456, "error": null}

``in_progress`` and ``max_concurrency`` give the utilization the policy works on. When the agent
cannot read its source (nginx down, port closed) it still reports, with ``in_progress`` null and
``error`` saying why: the manager then treats the server as not serving. A node of a single-IP
cluster adds ``table``: the dispatch table version it holds (``{"cluster": "vip-1",
"version": 7}``).

:func:`parse_report` validates a decoded body and raises :class:`~dnslb.errors.ProtocolError` with
every problem; :func:`report_to_dict` is its inverse.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dnslb.errors import ProtocolError
from dnslb.plan import MAX_TIME, show, text_problem

MAX_ID_LENGTH = 128
MAX_SEQ = 2**63 - 1
MAX_COUNT = 10**9
"""Largest ``in_progress`` and ``max_concurrency``: a billion requests at once is no server's."""
MAX_SERVED = 2**63 - 1
MAX_ERROR_LENGTH = 500


@dataclass(frozen=True, slots=True)
class TableHeld:
    """The dispatch table a cluster node has installed."""

    cluster: str
    version: int


@dataclass(frozen=True, slots=True)
class Report:
    """One utilization report from one agent."""

    server_id: str
    seq: int
    time: float
    in_progress: int | None
    max_concurrency: int | None
    cpu: float | None = None  # fraction of the machine's CPU in use, 0..1
    mem: float | None = None  # fraction of memory in use, 0..1
    served_total: int | None = None  # requests served since the server started
    error: str | None = None  # why the source could not be read (then in_progress is None)
    table: TableHeld | None = None

    @property
    def utilization(self) -> float | None:
        """Requests in progress over max concurrency; None when the source was unreadable."""
        if self.in_progress is None or not self.max_concurrency:
            return None
        return self.in_progress / self.max_concurrency


_FIELDS = (
    "server_id",
    "seq",
    "time",
    "in_progress",
    "max_concurrency",
    "cpu",
    "mem",
    "served_total",
    "error",
    "table",
)
_REQUIRED = ("server_id", "seq", "time", "in_progress", "max_concurrency")


def parse_report(body: object) -> Report:
    """Validate a decoded report; raises :class:`ProtocolError` naming every bad field."""
    if not isinstance(body, Mapping):
        raise ProtocolError("report must be a JSON object")
    problems = [f"{key}: unknown field" for key in body if key not in _FIELDS]
    problems += [f"{key}: missing" for key in _REQUIRED if key not in body]

    def integer(key: str, low: int, high: int, *, nullable: bool = False) -> int | None:
        value = body.get(key)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            problems.append(f"{key}: must be an integer from {low} to {high}, not {show(value)}")
            return None
        return value

    def fraction(key: str) -> float | None:
        value = body.get(key)
        if value is None:
            return None
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not _finite(value) or not 0 <= value <= 1:
            problems.append(f"{key}: must be a number from 0 to 1, not {show(value)}")
            return None
        return float(value)

    server_id = body.get("server_id")
    if id_problem(server_id):
        problems.append(f"server_id: {id_problem(server_id)}")
        server_id = None
    seq = integer("seq", 0, MAX_SEQ)
    when = body.get("time")
    if (
        isinstance(when, bool)
        or not isinstance(when, int | float)
        or not _finite(when)
        or not 0 <= when <= MAX_TIME
    ):
        problems.append(f"time: must be unix seconds, not {show(when)}")
        when = None
    in_progress = integer("in_progress", 0, MAX_COUNT, nullable=True)
    max_concurrency = integer("max_concurrency", 1, MAX_COUNT, nullable=True)
    served_total = integer("served_total", 0, MAX_SERVED, nullable=True)
    cpu = fraction("cpu")
    mem = fraction("mem")
    error = body.get("error")
    if error is not None and not isinstance(error, str):
        problems.append(f"error: must be a string or null, not {show(error)}")
        error = None
    elif error is not None:
        error = _printable(error[:MAX_ERROR_LENGTH])
    if "in_progress" in body and body.get("in_progress") is None and not error:
        problems.append("in_progress: null only with an error saying why")
    if in_progress is not None and max_concurrency is None and "max_concurrency" in body:
        problems.append("max_concurrency: required with in_progress")
    table = _parse_table(body.get("table"), problems)
    if problems or server_id is None or seq is None or when is None:
        raise ProtocolError("invalid report: " + "; ".join(problems))
    return Report(
        server_id=server_id,
        seq=seq,
        time=float(when),
        in_progress=in_progress,
        max_concurrency=max_concurrency,
        cpu=cpu,
        mem=mem,
        served_total=served_total,
        error=error or None,
        table=table,
    )


def _parse_table(value: object, problems: list[str]) -> TableHeld | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"cluster", "version"}:
        problems.append("table: must be {cluster, version}")
        return None
    cluster, version = value["cluster"], value["version"]
    if id_problem(cluster) or isinstance(version, bool) or not isinstance(version, int):
        problems.append("table: cluster must be an id and version an integer")
        return None
    if not 0 <= version <= MAX_SEQ:
        problems.append(f"table: version must be from 0 to {MAX_SEQ}, not {show(version)}")
        return None
    return TableHeld(cluster=cluster, version=version)


def id_problem(value: object) -> str | None:
    """Why ``value`` is not a server, node or cluster id, or None when it is one: a string of 1
    to 128 characters without control characters, line separators or lone surrogates (ids go
    into plans, logs, metrics labels and nftables comments)."""
    if not isinstance(value, str):
        return f"must be a string, not {show(value)}"
    if len(value) > MAX_ID_LENGTH:
        return f"must be at most {MAX_ID_LENGTH} characters"
    return text_problem(value)


def _finite(value: int | float) -> bool:
    if isinstance(value, int):
        return -(2**63) <= value <= 2**63  # float() of a huge integer overflows
    return math.isfinite(value)


def _printable(text: str) -> str:
    """``text`` with control characters and lone surrogates replaced (an agent's error message
    goes to logs, events and a UTF-8 database)."""
    if text_problem(text) is None:
        return text
    return "".join("\ufffd" if text_problem(char) else char for char in text)


def report_to_dict(report: Report) -> dict[str, Any]:
    """The JSON body of ``report``; :func:`parse_report` reads it back unchanged."""
    body: dict[str, Any] = {
        "server_id": report.server_id,
        "seq": report.seq,
        "time": report.time,
        "in_progress": report.in_progress,
        "max_concurrency": report.max_concurrency,
        "cpu": report.cpu,
        "mem": report.mem,
        "served_total": report.served_total,
        "error": report.error,
    }
    if report.table is not None:
        body["table"] = {"cluster": report.table.cluster, "version": report.table.version}
    return body
