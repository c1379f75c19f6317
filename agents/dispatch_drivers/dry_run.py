"""The ``dry-run`` dispatch driver: renders the same nftables scripts and keeps them in memory.

For machines without nftables (development, CI without root) and for operators who want to see
what the ``nftables`` driver would run: every script is logged at INFO and kept in ``scripts``,
and ``accepted`` says which buckets the node would accept now.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agents.dispatch_drivers.base import DispatchDriver, NodeRules
from agents.dispatch_drivers.nft_ruleset import render_apply, render_base, render_fence

log = logging.getLogger(__name__)


class DryRunDriver(DispatchDriver):
    """Keeps the rules it would install instead of installing them."""

    name = "dry-run"

    def __init__(self, rules: NodeRules) -> None:
        super().__init__(rules)
        self.scripts: list[str] = []
        self.accepted: frozenset[int] = frozenset()
        self.installed = False
        self.renewals = 0  # counted, not logged: they come several times a second
        self.last_renewal: float | None = None  # the seconds the last renewal asked for

    def _keep(self, script: str) -> None:
        self.scripts.append(script)
        log.info("dry-run: would run nft -f - with:\n%s", script.rstrip())

    def install(self) -> None:
        self._keep(render_base(self.rules.vip, self.rules.table_name, owner=self.rules.owner))
        self.installed = True
        self.accepted = frozenset()

    def apply(self, buckets: Sequence[int], bucket_count: int, seed: int) -> None:
        script = render_apply(
            self.rules.table_name,
            buckets,
            bucket_count,
            seed,
            require_listener=self.rules.require_listener,
            leased=self.rules.lease > 0,
        )
        self._keep(script)
        self.accepted = frozenset(buckets)

    def fence(self) -> None:
        self._keep(render_fence(self.rules.table_name))
        self.accepted = frozenset()

    def renew(self, seconds: float | None = None) -> None:
        self.renewals += 1
        self.last_renewal = self.rules.lease if seconds is None else seconds
