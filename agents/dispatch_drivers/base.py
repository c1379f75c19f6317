"""The dispatch driver interface: how a node agent puts a dispatch table into the packet path.

A driver owns one cluster's rules on one node. The node agent calls :meth:`install` once at start
(the node is then **fenced**: it accepts no new connection to the VIP, while connections it
already holds go on), then :meth:`apply` with this node's active buckets for every table it
accepts, :meth:`renew` after each heartbeat, and :meth:`fence` when it stops. Each call
is all-or-nothing: when it raises :class:`~dnslb.errors.ProcessError`, the rules are as they were
before the call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class NodeRules:
    """What the base ruleset of one cluster node needs to know."""

    vip: str  # the cluster's shared IPv4 address
    table_name: str = "dnslb"  # the nftables table the driver owns (ip family)
    # Accept a SYN only when a socket listens for it, so that a node whose service died drops
    # new connections silently (the manager moves its buckets) instead of answering with RST.
    require_listener: bool = True
    # Seconds the node keeps accepting new connections without a renewal from its agent
    # (0: forever). Shorter than the manager's failover_after, it makes a node whose agent died
    # stop accepting before the manager hands its buckets to other nodes.
    lease: float = 0.0
    # The cluster the table is for: written into the table's comment, the mark by which the agent
    # knows the table is its own (it never replaces a table without it).
    owner: str = ""
    # Set net.netfilter.nf_conntrack_tcp_loose to 0 at install (host-wide in the namespace).
    set_tcp_loose: bool = True


class DispatchDriver(ABC):
    """Installs and updates the rules that make this node accept only its buckets."""

    name: ClassVar[str]

    def __init__(self, rules: NodeRules) -> None:
        self.rules = rules

    @abstractmethod
    def install(self) -> None:
        """Install (or replace) the base ruleset, fenced: no bucket is accepted. Raises
        :class:`~dnslb.errors.ConfigError` when ``rules.table_name`` names a table that this
        driver did not create (it is left alone)."""

    @abstractmethod
    def apply(self, buckets: Sequence[int], bucket_count: int, seed: int) -> None:
        """Accept exactly ``buckets`` of ``jhash ip saddr . tcp sport mod bucket_count seed seed``,
        in one transaction."""

    @abstractmethod
    def fence(self) -> None:
        """Accept no new connection; established ones go on."""

    @abstractmethod
    def renew(self, seconds: float | None = None) -> None:
        """Restart the lease: ``seconds`` from now (``rules.lease`` when None). The agent calls it
        after each heartbeat the manager took, with what is left of ``rules.lease`` counted from
        when that heartbeat was sent."""
