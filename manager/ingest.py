"""Report ingest: authenticate, validate and record agent reports, counting every rejection.

A report is taken in two steps, so that nobody without a valid token makes the manager read a
body:

1. :meth:`ReportIngest.authenticate` looks at the bearer token alone (from the headers) and
   refuses it (401) unless its hash is one the manager knows: the shared agent token, a server's
   own token, a cluster node's token. It returns a :class:`Credential`.
2. :meth:`ReportIngest.record` parses the body and checks that the credential may report for the
   ``server_id`` it names, then records the report.

:meth:`ReportIngest.accept` does both (tests and fuzzing call it with a raw body). Either step
raises :class:`Rejected` with the HTTP status and a message for the agent. A caller without a
valid token learns nothing about which servers exist: a token valid for no reporter is refused
before its body is read, and a token valid for another reporter gets the same answer for a known
server as for an unknown one (only the shared agent token, which may report for any static
member, is told that a server id is unknown). Every outcome is counted by reason (``accepted``,
``bad_token``, ``unknown_server``, ``stale_seq``, ``too_large``...), for the metrics. Heartbeats
of single-IP cluster nodes go to their cluster's controller (which orders them by time as well as
seq: a restarted node agent starts its seq again).
"""

from __future__ import annotations

import hmac
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dnslb.errors import DnslbError, ProtocolError
from dnslb.model import ServerState
from dnslb.report import parse_report
from dnslb.tokens import token_hash
from manager.clusters import ClusterController
from manager.fleet import Fleet, ServerRuntime

MAX_BODY = 16 * 1024
"""Largest report body, in bytes (a report is about 200)."""

REINDEX_AFTER = 5.0
"""Seconds after which the token index is rebuilt anyway (it may miss a token made since)."""
REINDEX_BURST = 8
REINDEX_RATE = 4.0
"""Rebuilds a token not in the index may trigger: a burst of 8, then 4 a second (unknown tokens
from a flood cannot make every request walk the whole fleet)."""


class Rejected(DnslbError):
    """A report was refused; ``status`` is the HTTP status, ``reason`` the counter's name."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Credential:
    """A bearer token whose hash the manager knows (only the hash is kept); which reporter it
    may speak for is checked once the report names one."""

    hash: str = field(repr=False)

    def matches(self, stored_hash: str | None) -> bool:
        """True when this is the token stored as ``stored_hash`` (compared in constant time)."""
        return stored_hash is not None and hmac.compare_digest(self.hash, stored_hash)


class TokenIndex:
    """The hashes of every token that may report: a superset, kept cheaply.

    Looking a presented token's SHA-256 up in a set is one dict probe, whatever the fleet's size;
    the timing of that probe says nothing about the token (only about its hash). The set is built
    from the fleet, the cluster nodes and the shared token, and rebuilt when it may be out of
    date: the fleet's size changed, it is older than :data:`REINDEX_AFTER` seconds, or a token
    is not in it (at most :data:`REINDEX_BURST` times at once and :data:`REINDEX_RATE` a second,
    so a flood of unknown tokens costs a probe each, not a walk over the fleet). It may hold the
    hash of a token no longer valid (a server terminated since): :meth:`ReportIngest.record`
    checks every report against the fleet itself, so a stale entry never lets a report in.
    """

    def __init__(
        self,
        fleet: Fleet,
        node_hashes: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet = fleet
        self.node_hashes = dict(node_hashes)
        self.clock = clock
        self.rebuilds = 0
        self._hashes: frozenset[str] = frozenset()
        self._size = -1
        self._built_at = float("-inf")
        self._budget = float(REINDEX_BURST)
        self._budget_at = clock()

    def knows(self, presented_hash: str) -> bool:
        """True when ``presented_hash`` may be the hash of a reporter's token."""
        now = self.clock()
        fresh = len(self.fleet.servers) != self._size or now - self._built_at >= REINDEX_AFTER
        if fresh:
            self._rebuild(now)
        if presented_hash in self._hashes:
            return True
        self._budget = min(REINDEX_BURST, self._budget + (now - self._budget_at) * REINDEX_RATE)
        self._budget_at = now
        if fresh or self._budget < 1.0:
            return False
        self._budget -= 1.0
        self._rebuild(now)
        return presented_hash in self._hashes

    def _rebuild(self, now: float) -> None:
        hashes = {
            server.record.token_hash
            for server in self.fleet.servers.values()
            if server.record.token_hash is not None and server.state is not ServerState.TERMINATED
        }
        if self.fleet.agent_token_hash is not None:
            hashes.add(self.fleet.agent_token_hash)
        hashes.update(self.node_hashes.values())
        self._hashes = frozenset(hashes)
        self._size = len(self.fleet.servers)
        self._built_at = now
        self.rebuilds += 1


class ReportIngest:
    """Turns report requests into the fleet's newest reports."""

    def __init__(
        self,
        fleet: Fleet,
        monotonic: Callable[[], float],
        *,
        on_overload: Callable[[], None] | None = None,
        cluster_nodes: Mapping[str, tuple[ClusterController, str]] | None = None,
        seq_reset_after: float = math.inf,
    ) -> None:
        self.fleet = fleet
        self.monotonic = monotonic
        # A report with a lower seq is taken once the last one is this old (the manager's
        # down_after): an agent whose clock went back, or a server whose seq someone holding its
        # token drove to 2^63-1, is not shut out for good.
        self.seq_reset_after = seq_reset_after
        self.on_overload = on_overload
        self.cluster_nodes = cluster_nodes or {}  # node id -> (its controller, its token's hash)
        self.tokens = TokenIndex(
            fleet, {node: stored for node, (_, stored) in self.cluster_nodes.items()}
        )
        self.counts: Counter[str] = Counter()

    def authenticate(self, token: str | None) -> Credential:
        """The credential of a token some reporter holds, or :class:`Rejected` (401): from the
        headers alone, before any body is read."""
        if not token:
            raise self._count(Rejected(401, "bad_token", "missing bearer token"))
        presented = token_hash(token)
        if not self.tokens.knows(presented):
            raise self._count(Rejected(401, "bad_token", "token not valid"))
        return Credential(hash=presented)

    def check_length(self, length: int | None) -> None:
        """Refuse (413) a body whose declared length is over :data:`MAX_BODY`, before reading."""
        if length is not None and length > MAX_BODY:
            raise self._count(Rejected(413, "too_large", f"report larger than {MAX_BODY} bytes"))

    def record(self, credential: Credential, body: bytes) -> None:
        """Record one report sent with ``credential``, or raise :class:`Rejected`."""
        try:
            self._record(credential, body)
        except Rejected as rejected:
            raise self._count(rejected) from None
        self.counts["accepted"] += 1

    def accept(self, token: str | None, body: bytes) -> None:
        """Authenticate and record one report, or raise :class:`Rejected`."""
        self.record(self.authenticate(token), body)

    def _may_report(self, server: ServerRuntime, credential: Credential) -> bool:
        """:meth:`Fleet.may_report` on the hash the credential holds (the token is hashed once
        per request): a server's own token when it has one, else the shared agent token."""
        if server.record.token_hash is not None:
            return credential.matches(server.record.token_hash)
        return credential.matches(self.fleet.agent_token_hash)

    def _count(self, rejected: Rejected) -> Rejected:
        self.counts[rejected.reason] += 1
        return rejected

    def _record(self, credential: Credential, body: bytes) -> None:
        if len(body) > MAX_BODY:
            raise Rejected(413, "too_large", f"report larger than {MAX_BODY} bytes")
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the stack
            raise Rejected(400, "malformed", "body is not JSON") from None
        try:
            report = parse_report(decoded)
        except ProtocolError as exc:
            raise Rejected(422, "invalid", str(exc)) from None
        node = self.cluster_nodes.get(report.server_id)
        if node is not None:
            controller, stored_hash = node
            if not credential.matches(stored_hash):
                raise _not_yours(report.server_id)
            try:
                controller.observe(report, self.monotonic())
            except ProtocolError as exc:
                raise Rejected(400, "invalid", str(exc)) from None
            return
        server = self.fleet.servers.get(report.server_id)
        if server is None or server.state is ServerState.TERMINATED:
            if credential.matches(self.fleet.agent_token_hash):
                raise Rejected(404, "unknown_server", f"unknown server {report.server_id!r}")
            raise _not_yours(report.server_id)
        if not self._may_report(server, credential):
            raise _not_yours(report.server_id)
        now = self.monotonic()
        if (
            server.report is not None
            and report.seq <= server.report.seq
            and (server.report_at is None or now - server.report_at <= self.seq_reset_after)
        ):
            raise Rejected(
                409, "stale_seq", f"stale seq {report.seq}: already have {server.report.seq}"
            )
        server.report = report
        server.report_at = now
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


def _not_yours(reporter: str) -> Rejected:
    """The one answer for every reporter a valid token may not speak for, known or not: a
    holder of one server's token cannot tell which other ids exist."""
    return Rejected(401, "bad_token", f"token not valid for {reporter!r}")
