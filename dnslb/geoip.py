"""Clients located with a MaxMind-format database (GeoIP2 / GeoLite2 City or Country, or any
database whose records carry ``country.iso_code`` and ``subdivisions[].iso_code``).

A pool's ``geoip`` (:class:`dnslb.plan.GeoIp`) names the database and maps countries (``FR``)
and regions (``US-CA``: country, dash, the first subdivision's code) to locations; a region's
entry wins over its country's. :class:`GeoIpDatabase` answers, for one address, the location and
the prefix length of the database network the answer came from: the ECS scope of an answer it
decided. The reader is PyPI's ``maxminddb`` (the ``geoip`` extra), imported only when a plan
asks for a database, so the core and the pipe backend still start without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dnslb.errors import DnslbError


class GeoIpError(DnslbError):
    """A MaxMind-format database cannot be read (missing reader, file or format)."""


class GeoIpDatabase:
    """One open database and a pool's map of countries and regions to locations."""

    def __init__(self, path: str, locations: Iterable[tuple[str, str]]) -> None:
        try:
            import maxminddb  # noqa: PLC0415 (the geoip extra: only pools with a database)
        except ImportError:
            raise GeoIpError(
                f"cannot read {path}: the maxminddb package is missing (pip install 'dnslb[geoip]')"
            ) from None
        try:
            self._reader: Any = maxminddb.open_database(path)
        except (OSError, ValueError, maxminddb.InvalidDatabaseError) as exc:
            raise GeoIpError(f"cannot read {path}: {exc}") from None
        self.path = path
        self.codes = dict(locations)

    @property
    def location_names(self) -> set[str]:
        return set(self.codes.values())

    def lookup(self, address: str) -> tuple[str | None, int]:
        """(location or None, the prefix length of the database's network holding ``address``)."""
        try:
            record, prefix = self._reader.get_with_prefix_len(address)
        except (ValueError, RuntimeError) as exc:  # InvalidDatabaseError is a RuntimeError
            raise GeoIpError(f"{self.path}: lookup of {address!r} failed: {exc}") from None
        return self._location(record), int(prefix)

    def _location(self, record: object) -> str | None:
        if not isinstance(record, dict):
            return None
        country = record.get("country")
        code = country.get("iso_code") if isinstance(country, dict) else None
        if not isinstance(code, str):
            return None
        subdivisions = record.get("subdivisions")
        if isinstance(subdivisions, list) and subdivisions and isinstance(subdivisions[0], dict):
            region = subdivisions[0].get("iso_code")
            if isinstance(region, str) and f"{code}-{region}" in self.codes:
                return self.codes[f"{code}-{region}"]
        return self.codes.get(code)

    def close(self) -> None:
        self._reader.close()


__all__ = ["GeoIpDatabase", "GeoIpError"]
