"""Dispatch drivers, by name: ``nftables`` (the real one) and ``dry-run``.

See :mod:`agents.dispatch_drivers.base` for the interface. :data:`DRIVERS` is the registry: a new
driver is one module (a :class:`DispatchDriver` with its ``name``) and one line there. A driver
has no configuration of its own (the node agent's :class:`NodeRules` is what every driver
needs), so the node agent's ``driver`` setting is checked against :data:`DRIVERS` by name.
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
"""Each dispatch driver, by the name the node agent's ``driver`` setting gives."""


def create_driver(name: str, rules: NodeRules) -> DispatchDriver:
    """The driver registered as ``name``; raises :class:`ConfigError` for an unknown name."""
    try:
        driver = DRIVERS[name]
    except KeyError:
        known = ", ".join(sorted(DRIVERS))
        raise ConfigError("dispatch driver", [f"{name!r}: unknown (known: {known})"]) from None
    return driver(rules)


__all__ = ["DRIVERS", "DispatchDriver", "NodeRules", "create_driver"]
