"""The ``nftables`` dispatch driver: each change one nftables transaction (libnftables or nft).

At install it looks at the table it is configured to own: absent, it creates it (marked as the
agent's); present and marked as this cluster's agent's (or an unmarked table of an agent from
before the mark), it replaces it; anything else it refuses with a :class:`ConfigError` and leaves
alone (see :mod:`agents.dispatch_drivers.nft_ruleset`).

It also sets ``net.netfilter.nf_conntrack_tcp_loose`` to 0 unless told to keep it, and logs the
change (old -> new). That sysctl is one per network namespace: it changes conntrack for every
connection of the host (or container), not only the VIP's. docs/clusters.md has the trade-off.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from agents.dispatch_drivers.base import DispatchDriver, NodeRules
from agents.dispatch_drivers.nft_ruleset import (
    ownership_problem,
    parse_table_listing,
    render_apply,
    render_base,
    render_fence,
    render_renew,
)
from agents.dispatch_drivers.nft_runner import NftRunner, default_runner
from dnslb.errors import ConfigError, ProcessError

log = logging.getLogger(__name__)

# Off, conntrack would adopt a mid-stream packet of a connection another node holds as a new
# flow; with any rule that accepts "ct state new", the stack then answers it with RST.
TCP_LOOSE = Path("/proc/sys/net/netfilter/nf_conntrack_tcp_loose")


class NftablesDriver(DispatchDriver):
    """Needs root (CAP_NET_ADMIN) in the node's network namespace."""

    name = "nftables"

    def __init__(
        self, rules: NodeRules, runner: NftRunner | None = None, tcp_loose: Path = TCP_LOOSE
    ) -> None:
        super().__init__(rules)
        self.runner = runner or default_runner()
        self.tcp_loose = tcp_loose

    def install(self) -> None:
        table = self.rules.table_name
        handle: int | None = None
        listed = self.runner.output("list tables").splitlines()
        if any(line.split()[:3] == ["table", "ip", table] for line in listed):
            listing = parse_table_listing(self.runner.output(f"list table ip {table}"))
            problem = ownership_problem(listing, table, self.rules.owner)
            if problem is not None:
                raise ConfigError("node agent", [f"nft_table: {problem}"])
            if listing.handle is None:
                raise ProcessError(f"nft did not say the handle of table ip {table}")
            if listing.comment is None:
                log.info("taking over table ip %s of an earlier agent (unmarked)", table)
            handle = listing.handle
        self.runner.run(
            render_base(self.rules.vip, table, owner=self.rules.owner, replace_handle=handle)
        )
        self._tcp_loose()

    def _tcp_loose(self) -> None:
        """Turn ``nf_conntrack_tcp_loose`` off (unless told to keep it), saying what it was."""
        try:
            old = self.tcp_loose.read_text().strip()
        except OSError as exc:
            raise ProcessError(f"cannot read {self.tcp_loose}: {exc.strerror}") from None
        if not self.rules.set_tcp_loose:
            log.info("net.netfilter.nf_conntrack_tcp_loose left at %s (keep_tcp_loose)", old)
            return
        if old == "0":
            log.info("net.netfilter.nf_conntrack_tcp_loose is 0 already")
            return
        try:
            self.tcp_loose.write_text("0\n")
        except OSError as exc:
            raise ProcessError(f"cannot set {self.tcp_loose}: {exc.strerror}") from None
        log.warning(
            "set net.netfilter.nf_conntrack_tcp_loose %s -> 0: for every connection of this "
            "network namespace, not only the VIP's (keep_tcp_loose leaves it alone)",
            old,
        )

    def apply(self, buckets: Sequence[int], bucket_count: int, seed: int) -> None:
        script = render_apply(
            self.rules.table_name,
            buckets,
            bucket_count,
            seed,
            require_listener=self.rules.require_listener,
            leased=self.rules.lease > 0,
        )
        self.runner.run(script)

    def fence(self) -> None:
        self.runner.run(render_fence(self.rules.table_name))

    def renew(self, seconds: float | None = None) -> None:
        if self.rules.lease > 0:
            lease = self.rules.lease if seconds is None else seconds
            self.runner.run(render_renew(self.rules.table_name, self.rules.vip, lease))
