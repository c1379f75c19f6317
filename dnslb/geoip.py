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

import os
import stat
from collections.abc import Iterable
from typing import Any

from dnslb.errors import DnslbError
from dnslb.plan import geoip_path_problem

MAX_GEOIP_BYTES = 2 * 1024**3  # GeoIP2 City is about 100 MB; nothing real comes near this


class GeoIpError(DnslbError):
    """A MaxMind-format database cannot be read (missing reader, file or format)."""


def database_file(path: str) -> os.stat_result:
    """The status of the file at ``path`` if it may be opened as a database: a path by the
    plan's rule (:func:`dnslb.plan.geoip_path_problem`) naming a regular file of at most
    :data:`MAX_GEOIP_BYTES`; else :class:`GeoIpError`. The path comes from a plan, which the
    plan store's every writer could have written: it is opened without blocking (a FIFO would
    hold the plan loader forever) and never read unless it is a plain file."""
    if problem := geoip_path_problem(path):
        raise GeoIpError(f"cannot read {path!r}: {problem}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise GeoIpError(f"cannot read {path}: {exc.strerror}") from None
    try:
        status = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(status.st_mode):
        raise GeoIpError(f"cannot read {path}: not a regular file")
    if status.st_size > MAX_GEOIP_BYTES:
        raise GeoIpError(f"cannot read {path}: {status.st_size} bytes, over {MAX_GEOIP_BYTES}")
    return status


class GeoIpDatabase:
    """One open database and a pool's map of countries and regions to locations.

    ``status`` is the file's status when it was opened (:func:`database_file`): a reader can
    tell whether the file was replaced since (a database update) and reopen it."""

    def __init__(self, path: str, locations: Iterable[tuple[str, str]]) -> None:
        self.status = database_file(path)
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


__all__ = ["MAX_GEOIP_BYTES", "GeoIpDatabase", "GeoIpError", "database_file"]
