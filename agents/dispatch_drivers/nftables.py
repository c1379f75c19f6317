"""The ``nftables`` dispatch driver: each change one nftables transaction (libnftables or nft)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agents.dispatch_drivers.base import DispatchDriver, NodeRules
from agents.dispatch_drivers.nft_ruleset import (
    render_apply,
    render_base,
    render_fence,
    render_renew,
)
from agents.dispatch_drivers.nft_runner import NftRunner, default_runner
from dnslb.errors import ProcessError

# Off, conntrack would adopt a mid-stream packet of a connection another node holds as a new
# flow; with any rule that accepts "ct state new", the stack then answers it with RST.
TCP_LOOSE = Path("/proc/sys/net/netfilter/nf_conntrack_tcp_loose")


class NftablesDriver(DispatchDriver):
    """Needs root (CAP_NET_ADMIN) in the node's network namespace."""

    name = "nftables"

    def __init__(self, rules: NodeRules, runner: NftRunner | None = None) -> None:
        super().__init__(rules)
        self.runner = runner or default_runner()

    def install(self) -> None:
        self.runner.run(render_base(self.rules.vip, self.rules.table_name))
        try:
            TCP_LOOSE.write_text("0\n")
        except OSError as exc:
            raise ProcessError(f"cannot set {TCP_LOOSE}: {exc.strerror}") from None

    def apply(self, buckets: Sequence[int], bucket_count: int, seed: int) -> None:
        script = render_apply(
            self.rules.table_name,
            buckets,
            bucket_count,
            seed,
            require_listener=self.rules.require_listener,
            lease=self.rules.lease,
            vip=self.rules.vip,
        )
        self.runner.run(script)

    def fence(self) -> None:
        self.runner.run(render_fence(self.rules.table_name))

    def renew(self) -> None:
        if self.rules.lease > 0:
            self.runner.run(render_renew(self.rules.table_name, self.rules.vip, self.rules.lease))
