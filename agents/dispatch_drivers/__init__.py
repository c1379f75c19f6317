"""Dispatch drivers, by name: ``nftables`` (the real one) and ``dry-run``.

See :mod:`agents.dispatch_drivers.base` for the interface.
"""

from __future__ import annotations

from agents.dispatch_drivers.base import DispatchDriver, NodeRules
from agents.dispatch_drivers.dry_run import DryRunDriver
from agents.dispatch_drivers.nftables import NftablesDriver
from dnslb.errors import ConfigError

DRIVERS: dict[str, type[DispatchDriver]] = {
    NftablesDriver.name: NftablesDriver,
    DryRunDriver.name: DryRunDriver,
}


def create_driver(name: str, rules: NodeRules) -> DispatchDriver:
    """The driver registered as ``name``; raises :class:`ConfigError` for an unknown name."""
    try:
        driver = DRIVERS[name]
    except KeyError:
        known = ", ".join(sorted(DRIVERS))
        raise ConfigError("dispatch driver", [f"{name!r}: unknown (known: {known})"]) from None
    return driver(rules)


__all__ = ["DRIVERS", "DispatchDriver", "NodeRules", "create_driver"]
