"""The ``nftables`` dispatch driver: rules applied with ``nft -f -``, one transaction each."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path

from agents.dispatch_drivers.base import DispatchDriver, NodeRules
from agents.dispatch_drivers.nft_ruleset import render_apply, render_base, render_fence
from dnslb.errors import ProcessError

log = logging.getLogger(__name__)

# Off, conntrack would adopt a mid-stream packet of a connection another node holds as a new
# flow; with any rule that accepts "ct state new", the stack then answers it with RST.
TCP_LOOSE = Path("/proc/sys/net/netfilter/nf_conntrack_tcp_loose")
NFT_TIMEOUT = 10.0


class NftablesDriver(DispatchDriver):
    """Runs ``nft`` as a subprocess; needs root (CAP_NET_ADMIN) in the node's network namespace."""

    name = "nftables"

    def __init__(self, rules: NodeRules, nft: str = "nft") -> None:
        super().__init__(rules)
        self.nft = nft

    def _run(self, script: str) -> None:
        try:
            done = subprocess.run(
                [self.nft, "-f", "-"],
                input=script,
                capture_output=True,
                text=True,
                timeout=NFT_TIMEOUT,
                check=False,
            )
        except FileNotFoundError:
            raise ProcessError(f"nft not found ({self.nft!r}): install nftables") from None
        except subprocess.TimeoutExpired:
            raise ProcessError(f"nft did not finish in {NFT_TIMEOUT:.0f} s") from None
        if done.returncode != 0:
            detail = done.stderr.strip().splitlines()
            raise ProcessError(f"nft failed ({done.returncode}): {' | '.join(detail[:6])}")

    def install(self) -> None:
        self._run(render_base(self.rules.vip, self.rules.table_name))
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
        )
        self._run(script)

    def fence(self) -> None:
        self._run(render_fence(self.rules.table_name))
