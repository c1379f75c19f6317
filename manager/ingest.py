"""Report ingest: authenticate, validate and record agent reports, counting every rejection.

:meth:`ReportIngest.accept` takes the bearer token and the raw body of ``POST /v1/reports`` and
either records the report or raises :class:`Rejected` with the HTTP status and a message for the
agent. Callers without a valid token learn nothing about which servers exist. Every outcome is
counted by reason (``accepted``, ``bad_token``, ``unknown_server``, ``stale_seq``...), for the
metrics. Heartbeats of single-IP cluster nodes go to their cluster's controller (which orders
them by time as well as seq: a restarted node agent starts its seq again).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping

from dnslb.errors import DnslbError, ProtocolError
from dnslb.model import ServerState
from dnslb.report import parse_report
from dnslb.tokens import token_matches
from manager.clusters import ClusterController
from manager.fleet import Fleet

MAX_BODY = 16 * 1024


class Rejected(DnslbError):
    """A report was refused; ``status`` is the HTTP status, ``reason`` the counter's name."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


class ReportIngest:
    """Turns report requests into the fleet's newest reports."""

    def __init__(
        self,
        fleet: Fleet,
        monotonic: Callable[[], float],
        *,
        on_overload: Callable[[], None] | None = None,
        cluster_nodes: Mapping[str, tuple[ClusterController, str]] | None = None,
    ) -> None:
        self.fleet = fleet
        self.monotonic = monotonic
        self.on_overload = on_overload
        self.cluster_nodes = cluster_nodes or {}  # node id -> (its controller, its token's hash)
        self.counts: Counter[str] = Counter()

    def accept(self, token: str | None, body: bytes) -> None:
        """Record one report, or raise :class:`Rejected`."""
        try:
            self._accept(token, body)
        except Rejected as rejected:
            self.counts[rejected.reason] += 1
            raise
        self.counts["accepted"] += 1

    def _accept(self, token: str | None, body: bytes) -> None:
        if not token:
            raise Rejected(401, "bad_token", "missing bearer token")
        if len(body) > MAX_BODY:
            raise Rejected(413, "too_large", f"report larger than {MAX_BODY} bytes")
        try:
            decoded = json.loads(body)
        except ValueError:
            raise Rejected(400, "malformed", "body is not JSON") from None
        try:
            report = parse_report(decoded)
        except ProtocolError as exc:
            raise Rejected(422, "invalid", str(exc)) from None
        node = self.cluster_nodes.get(report.server_id)
        if node is not None:
            controller, stored_hash = node
            if not token_matches(token, stored_hash):
                raise Rejected(401, "bad_token", f"token not valid for node {report.server_id!r}")
            try:
                controller.observe(report, self.monotonic())
            except ProtocolError as exc:
                raise Rejected(400, "invalid", str(exc)) from None
            return
        server = self.fleet.servers.get(report.server_id)
        if server is None or server.state is ServerState.TERMINATED:
            if self.fleet.is_agent_token(token):
                raise Rejected(404, "unknown_server", f"unknown server {report.server_id!r}")
            raise Rejected(401, "bad_token", "token not valid")
        if not self.fleet.may_report(server, token):
            raise Rejected(401, "bad_token", f"token not valid for server {report.server_id!r}")
        if server.report is not None and report.seq <= server.report.seq:
            raise Rejected(
                409, "stale_seq", f"stale seq {report.seq}: already have {server.report.seq}"
            )
        server.report = report
        server.report_at = self.monotonic()
        server.count_served(report.served_total)
        utilization = report.utilization
        if (
            self.on_overload is not None
            and utilization is not None
            and not server.paused
            and server.record.pool in self.fleet.pools
            and utilization > self.fleet.pools[server.record.pool].policy.th_over
        ):
            self.on_overload()
