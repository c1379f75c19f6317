"""The plan: the manager's published output and the only thing a pipe backend needs.

A plan is a versioned, self-contained JSON snapshot (reference: ``docs/plan.md``): the zones the
DNS servers are authoritative for, and per load-balanced name (a *pool*) its members with address,
weight, TTL and state, the number of addresses per answer ``k``, the TTL floor and the fallback
policy. An operator can write one by hand; the pipe backend alone is then a static weighted DNS.

:func:`parse_plan` validates a decoded document and reports *every* problem with its path
(``pools[2].members[0].address: not an IP address``) in one :class:`~dnslb.errors.PlanError`.
:func:`plan_to_dict` is its inverse. Both are pure; reading and publishing files lives in
:mod:`dnslb.plan_store`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import re
import reprlib
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from dnslb.dnsname import is_within, name_problem, normalize
from dnslb.errors import PlanError

FORMAT = 1
"""The plan format this code reads and writes (the document's ``format`` field)."""

MAX_TTL = 2**31 - 1
_E = TypeVar("_E", bound=StrEnum)
MAX_K = 64
MAX_WEIGHT = 1e9
"""Largest member weight: the manager's weights are at most a server's max concurrency."""
MAX_UTILIZATION = 1e9
"""Largest utilization a plan may carry (in progress over max concurrency may exceed 1; a
report's counts are at most 10^9)."""
MAX_TIME = 1e11
"""Latest ``generated_at`` (unix seconds, about the year 5100) and longest ``stale_after``."""
MAX_EPOCH = 2**53
"""Largest leadership epoch (a counter in the database; 2^53 stays exact in any JSON reader)."""
MAX_ID_LENGTH = 128
MAX_TEXT_LENGTH = 4096
MAX_NETWORKS = 10_000
"""Most client networks one pool may map to locations (every pipe backend compiles them)."""
LOCATION = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}\Z")
GEOIP_CODE = re.compile(r"[A-Z]{2}(-[A-Z0-9]{1,3})?\Z")
"""A country (ISO 3166-1 alpha-2, ``FR``) or a country's region (ISO 3166-2, ``US-CA``)."""
MAX_GEOIP_CODES = 5000
MAX_GEOIP_PATH = 1024  # characters of a database's path
GEOIP_PATH = re.compile(r"/[A-Za-z0-9._/+@-]*\.mmdb")
"""Most countries and regions one pool's MaxMind database map may name."""
"""A location's name (a region or a site): a short lower-case token, ``eu-west``, ``dc2``."""
"""Longest text field (a static record's content); names are limited by DNS itself."""

_SHOW = reprlib.Repr()
_SHOW.maxstring = 60
_SHOW.maxother = 60
_SHOW.maxlevel = 3


def show(value: object) -> str:
    """A short, safe ``repr`` of a value from a document, for messages: bounded in length and
    depth (a deeply nested list must not raise RecursionError while its error is worded)."""
    return _SHOW.repr(value)


_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")
_NOT_PRINTABLE_ASCII = re.compile("[^\x20-\x7e]")


def text_problem(text: str, *, ascii_only: bool = False) -> str | None:
    """Why ``text`` may not be carried as a plan's text (an id, a record's content), or None.

    Control characters (tab and newline split the pipe protocol's lines), line separators, lone
    surrogates (not UTF-8) and, with ``ascii_only``, anything outside printable ASCII are
    refused.
    """
    if not text:
        return "must not be empty"
    found = _FORBIDDEN.search(text)
    if found:
        char = found.group()
        kind = "line separator" if char in "\u2028\u2029" else "control or surrogate character"
        return f"holds the {kind} {char!r}"
    if ascii_only and (found := _NOT_PRINTABLE_ASCII.search(text)):
        return f"holds the non-ASCII character {found.group()!r} (use \\DDD escapes)"
    return None


class MemberState(StrEnum):
    """A member's state as the plan carries it; only ``active`` members are answered normally."""

    ACTIVE = "active"
    PAUSED = "paused"  # above th_over: left out until it recovers
    DOWN = "down"  # failed health checks or stopped reporting
    DRAINING = "draining"  # leaving the pool: never answered again
    DISABLED = "disabled"  # taken out by an operator: never answered


class Fallback(StrEnum):
    """What a pool answers when none of its members (of one address family) is active."""

    FAIL_OPEN = "fail_open"  # the least-loaded paused members, else the down ones
    LEAST_LOADED = "least_loaded"  # the least-loaded paused members, else no data
    NODATA = "nodata"  # no addresses at all


@dataclass(frozen=True, slots=True)
class Member:
    """One server behind a load-balanced name."""

    id: str
    address: str  # normalized text form of an IPv4 or IPv6 address
    weight: float
    ttl: int
    state: MemberState = MemberState.ACTIVE
    utilization: float = 0.0
    location: str | None = None  # its region or site (dnslb.topology)

    @property
    def ipv6(self) -> bool:
        return ":" in self.address


@dataclass(frozen=True, slots=True)
class Network:
    """Clients in ``network`` (``10.0.0.0/8``, normalized) are in ``location``."""

    network: str
    location: str


@dataclass(frozen=True, slots=True)
class GeoIp:
    """Clients located with a MaxMind-format database: its countries and regions by location."""

    database: str  # absolute path, read by each pipe backend
    locations: tuple[tuple[str, str], ...]  # (country or region code, location), sorted


@dataclass(frozen=True, slots=True)
class Pool:
    """A load-balanced name and the members its answers are chosen from."""

    name: str
    members: tuple[Member, ...]
    k: int = 4
    ttl_floor: int = 5
    fallback: Fallback = Fallback.FAIL_OPEN
    networks: tuple[Network, ...] = ()  # client networks by location (dnslb.topology)
    geoip: GeoIp | None = None  # where the networks do not say (dnslb.geoip)


@dataclass(frozen=True, slots=True)
class Soa:
    mname: str
    rname: str
    serial: int
    refresh: int = 10800
    retry: int = 3600
    expire: int = 604800
    minimum: int = 60  # negative-caching TTL (RFC 2308)
    ttl: int = 3600

    def content(self) -> str:
        """The SOA record's data in zone-file order."""
        return (
            f"{self.mname} {self.rname} {self.serial} {self.refresh} {self.retry} "
            f"{self.expire} {self.minimum}"
        )


@dataclass(frozen=True, slots=True)
class Record:
    """A static record of a zone (apex A, MX, TXT, glue for the NS names...)."""

    name: str
    type: str
    ttl: int
    content: str


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    soa: Soa
    ns: tuple[str, ...]
    ns_ttl: int = 3600
    records: tuple[Record, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """A whole published plan; ``zones`` order gives each zone its id (index + 1)."""

    version: int
    zones: tuple[Zone, ...]
    pools: tuple[Pool, ...] = ()
    generated_at: float | None = None  # unix seconds; None for a hand-written plan
    stale_after: float | None = None  # seconds after generated_at; None: never stale
    epoch: int = 0  # the leading manager's fencing epoch; 0 without leadership (one manager)

    def age(self, now: float) -> float | None:
        """Seconds since the plan was generated, or None when it does not say."""
        return None if self.generated_at is None else now - self.generated_at

    def is_stale(self, now: float) -> bool:
        """True when the plan is older than its ``stale_after``."""
        if self.generated_at is None or self.stale_after is None:
            return False
        return now - self.generated_at > self.stale_after

    def zone_of(self, name: str) -> int | None:
        """The id of the closest zone holding ``name`` (normalized), or None."""
        best: tuple[int, int] | None = None
        for index, zone in enumerate(self.zones):
            if is_within(name, zone.name) and (best is None or len(zone.name) > best[0]):
                best = (len(zone.name), index + 1)
        return None if best is None else best[1]


# Record types a zone may carry as static records, with how their content is checked.
STATIC_TYPES = ("A", "AAAA", "CNAME", "MX", "NS", "TXT", "SRV", "CAA", "PTR")


class _Reader:
    """Collects every problem of a document, each with its path."""

    def __init__(self, pace: Callable[[], None] | None = None) -> None:
        self.problems: list[str] = []
        self.pace = pace  # called every few members read (parse_plan's pace)

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}" if path else message)

    def mapping(
        self,
        value: object,
        path: str,
        required: tuple[str, ...],
        optional: tuple[str, ...] = (),
    ) -> Mapping[str, Any] | None:
        if not isinstance(value, Mapping):
            self.fail(path, f"must be an object, not {_kind(value)}")
            return None
        for key in value:
            if key not in required and key not in optional:
                self.fail(_join(path, _key(key)), "unknown field")
        for key in required:
            if key not in value:
                self.fail(_join(path, key), "missing")
        return value

    def integer(self, value: object, path: str, low: int, high: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, not {_kind(value)}")
            return None
        if not low <= value <= high:
            self.fail(path, f"must be between {low} and {high}, not {show(value)}")
            return None
        return value

    def number(self, value: object, path: str, low: float, high: float) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, f"must be a number, not {_kind(value)}")
            return None
        if isinstance(value, int) and not -(2**63) <= value <= 2**63:
            number = math.inf  # float() of a huge integer raises OverflowError
        else:
            number = float(value)
        if not math.isfinite(number) or not low <= number <= high:
            self.fail(path, f"must be between {low:g} and {high:g}, not {show(value)}")
            return None
        return number

    def text(
        self, value: object, path: str, *, limit: int = MAX_TEXT_LENGTH, ascii_only: bool = False
    ) -> str | None:
        if not isinstance(value, str):
            self.fail(path, f"must be a string, not {_kind(value)}")
            return None
        if len(value) > limit:
            self.fail(path, f"must be at most {limit} characters, not {len(value)}")
            return None
        problem = text_problem(value, ascii_only=ascii_only)
        if problem:
            self.fail(path, problem)
            return None
        return value

    def name(self, value: object, path: str, *, wildcard: bool = False) -> str | None:
        text = self.text(value, path)
        if text is None:
            return None
        name = normalize(text)
        problem = name_problem(name, wildcard=wildcard)
        if problem:
            self.fail(path, f"{show(text)} is not a valid DNS name: {problem}")
            return None
        return name

    def choice(self, value: object, path: str, enum: type[_E]) -> _E | None:
        if isinstance(value, str):
            try:
                return enum(value)
            except ValueError:
                pass
        allowed = ", ".join(member.value for member in enum)
        self.fail(path, f"must be one of {allowed}, not {show(value)}")
        return None

    def items(self, value: object, path: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, f"must be a list, not {_kind(value)}")
            return []
        return value


def _key(key: object) -> str:
    """A document's key as it may appear in a path: escaped and shortened like :func:`show`."""
    text = show(str(key))
    return text[1:-1] if text[:1] in "'\"" and text[-1:] == text[:1] else text


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )


def parse_plan(
    document: object,
    *,
    known: Sequence[Pool | None] = (),
    pace: Callable[[], None] | None = None,
) -> Plan:
    """Validate a decoded plan document and build the :class:`Plan`.

    ``known[i]``, when given and not None, is the pool ``pools[i]`` was already read as (its
    exact JSON text was validated before: :class:`PoolCache`); it is taken without checking the
    item again. ``pace`` is called after each pool validated and every 32 of its members
    (:attr:`PoolCache.pace`). Raises :class:`PlanError` listing every problem found, each with
    its path.
    """
    reader = _Reader(pace)
    top = reader.mapping(
        document,
        "",
        required=("format", "version", "zones"),
        optional=("generated_at", "stale_after", "pools", "epoch"),
    )
    if top is None:
        raise PlanError("invalid plan", reader.problems)
    if "format" in top and top["format"] != FORMAT:
        reader.fail("format", f"this dnslb reads plan format {FORMAT}, not {show(top['format'])}")
    version = reader.integer(top.get("version"), "version", 0, 2**63 - 1) if "version" in top else 0
    epoch = reader.integer(top.get("epoch", 0), "epoch", 0, MAX_EPOCH)
    generated_at = None
    if top.get("generated_at") is not None:
        generated_at = reader.number(top["generated_at"], "generated_at", 0.0, MAX_TIME)
    stale_after = None
    if top.get("stale_after") is not None:
        stale_after = reader.number(top["stale_after"], "stale_after", 0.001, MAX_TIME)

    zone_items = reader.items(top["zones"], "zones") if "zones" in top else []
    if top.get("zones") == []:
        reader.fail("zones", "must hold at least one zone")
    zones = tuple(
        zone
        for index, item in enumerate(zone_items)
        if (zone := _parse_zone(reader, item, f"zones[{index}]", version or 0)) is not None
    )
    _check_unique(reader, [zone.name for zone in zones], "zones", "name", "zone")

    pools: list[Pool] = []
    for index, item in enumerate(reader.items(top.get("pools", []), "pools")):
        pool = known[index] if index < len(known) else None
        if pool is None:
            pool = _parse_pool(reader, item, f"pools[{index}]")
            if pace is not None:
                pace()
        if pool is None:
            continue
        if zones and not any(is_within(pool.name, zone.name) for zone in zones):
            reader.fail(f"pools[{index}].name", f"{pool.name!r} is not inside any zone of the plan")
        pools.append(pool)
    _check_unique(reader, [pool.name for pool in pools], "pools", "name", "pool")
    _check_pool_conflicts(reader, zones, pools)

    if reader.problems or version is None or epoch is None:
        raise PlanError("invalid plan", reader.problems)
    return Plan(
        version=version,
        epoch=epoch,
        zones=zones,
        pools=tuple(pools),
        generated_at=generated_at,
        stale_after=stale_after,
    )


def _check_unique(reader: _Reader, values: list[str], path: str, key: str, what: str) -> None:
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            reader.fail(f"{path}[{index}].{key}", f"duplicate {what} {value!r}")
        seen.add(value)


def _check_pool_conflicts(reader: _Reader, zones: tuple[Zone, ...], pools: list[Pool]) -> None:
    pool_names = {pool.name: index for index, pool in enumerate(pools)}
    for z_index, zone in enumerate(zones):
        for r_index, record in enumerate(zone.records):
            if record.name in pool_names and record.type in ("A", "AAAA", "CNAME"):
                reader.fail(
                    f"zones[{z_index}].records[{r_index}]",
                    f"{record.type} record for {record.name!r} conflicts with "
                    f"pools[{pool_names[record.name]}] of the same name",
                )


def _parse_zone(reader: _Reader, item: object, path: str, version: int) -> Zone | None:
    raw = reader.mapping(item, path, required=("name", "ns"), optional=("soa", "ns_ttl", "records"))
    if raw is None:
        return None
    before = len(reader.problems)
    name = reader.name(raw.get("name"), f"{path}.name")
    ns = tuple(
        ns_name
        for index, value in enumerate(reader.items(raw.get("ns", []), f"{path}.ns"))
        if (ns_name := reader.name(value, f"{path}.ns[{index}]")) is not None
    )
    if "ns" in raw and isinstance(raw["ns"], list) and not raw["ns"]:
        reader.fail(f"{path}.ns", "must name at least one name server")
    ns_ttl = reader.integer(raw.get("ns_ttl", 3600), f"{path}.ns_ttl", 0, MAX_TTL)
    soa = _parse_soa(
        reader, raw.get("soa", {}), f"{path}.soa", zone=name or "", ns=ns, version=version
    )
    records: list[Record] = []
    for index, value in enumerate(reader.items(raw.get("records", []), f"{path}.records")):
        record = _parse_record(reader, value, f"{path}.records[{index}]")
        if record is None:
            continue
        if name and not is_within(record.name, name):
            reader.fail(f"{path}.records[{index}].name", f"{record.name!r} is not inside {name!r}")
        records.append(record)
    _check_cnames(reader, name, records, path)
    if len(reader.problems) > before or name is None or soa is None or ns_ttl is None:
        return None
    return Zone(name=name, soa=soa, ns=ns, ns_ttl=ns_ttl, records=tuple(records))


def _check_cnames(reader: _Reader, zone: str | None, records: list[Record], path: str) -> None:
    """A CNAME is alone at its name (RFC 1034 3.6.2) and never at the apex (SOA and NS are)."""
    types: dict[str, list[str]] = {}
    for record in records:
        types.setdefault(record.name, []).append(record.type)
    for index, record in enumerate(records):
        if record.type != "CNAME":
            continue
        where = f"{path}.records[{index}]"
        if record.name == zone:
            reader.fail(where, f"a CNAME cannot be at the zone's apex {record.name!r}")
        elif len(types[record.name]) > 1:
            others = ", ".join(sorted(set(types[record.name])))
            reader.fail(where, f"a CNAME must be alone at {record.name!r}, which has {others}")


def _parse_soa(
    reader: _Reader, item: object, path: str, *, zone: str, ns: tuple[str, ...], version: int
) -> Soa | None:
    fields = ("mname", "rname", "serial", "refresh", "retry", "expire", "minimum", "ttl")
    raw = reader.mapping(item, path, required=(), optional=fields)
    if raw is None:
        return None
    mname = reader.name(raw["mname"], f"{path}.mname") if "mname" in raw else None
    rname = reader.name(raw["rname"], f"{path}.rname") if "rname" in raw else None
    numbers: dict[str, int | None] = {}
    for key, default in (
        ("serial", version % 2**32),
        ("refresh", 10800),
        ("retry", 3600),
        ("expire", 604800),
        ("minimum", 60),
        ("ttl", 3600),
    ):
        high = 2**32 - 1 if key == "serial" else MAX_TTL
        numbers[key] = reader.integer(raw.get(key, default), f"{path}.{key}", 0, high)
    if any(value is None for value in numbers.values()):
        return None
    values = {key: value for key, value in numbers.items() if value is not None}
    return Soa(
        mname=mname or (ns[0] if ns else f"ns1.{zone}"),
        rname=rname or f"hostmaster.{zone}",
        **values,
    )


def _parse_record(reader: _Reader, item: object, path: str) -> Record | None:
    raw = reader.mapping(item, path, required=("name", "type", "content"), optional=("ttl",))
    if raw is None:
        return None
    name = reader.name(raw.get("name"), f"{path}.name", wildcard=True)
    rtype = raw.get("type")
    if rtype not in STATIC_TYPES:
        reader.fail(f"{path}.type", f"must be one of {', '.join(STATIC_TYPES)}, not {show(rtype)}")
        return None
    ttl = reader.integer(raw.get("ttl", 3600), f"{path}.ttl", 0, MAX_TTL)
    content = reader.text(raw.get("content"), f"{path}.content", ascii_only=True)
    if content is not None:
        content = _check_content(reader, rtype, content, f"{path}.content")
    if name is None or ttl is None or content is None:
        return None
    return Record(name=name, type=rtype, ttl=ttl, content=content)


def _check_content(reader: _Reader, rtype: str, content: str, path: str) -> str | None:
    """Validate and normalize a static record's data; names lose their trailing dot."""
    fields = content.split()
    if rtype in ("A", "AAAA"):
        address = _address(content.strip())
        if address is None or (":" in address) != (rtype == "AAAA"):
            reader.fail(
                path, f"{show(content)} is not an {'IPv6' if rtype == 'AAAA' else 'IPv4'} address"
            )
            return None
        return address
    if rtype in ("CNAME", "NS", "PTR"):
        return reader.name(content, path)
    if rtype == "MX":
        if len(fields) != 2 or not _uint16(fields[0]):
            reader.fail(path, f"MX content must be 'preference exchange', not {show(content)}")
            return None
        exchange = reader.name(fields[1], path)
        return None if exchange is None else f"{int(fields[0])} {exchange}"
    if rtype == "SRV":
        if len(fields) != 4 or not all(_uint16(part) for part in fields[:3]):
            reader.fail(
                path, f"SRV content must be 'priority weight port target', not {show(content)}"
            )
            return None
        target = reader.name(fields[3], path)
        return None if target is None else " ".join([*fields[:3], target])
    if rtype == "CAA" and (len(fields) < 3 or not _uint16(fields[0]) or int(fields[0]) > 255):
        reader.fail(path, f"CAA content must be 'flags tag value', not {show(content)}")
        return None
    return content


def _uint16(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= 65535


def _address(text: str) -> str | None:
    """The normal text form of an IP address (RFC 5952 for IPv6), or None. A scoped IPv6
    address (``fe80::1%eth0``) is refused: a DNS answer cannot carry the scope, and the scope is
    free text. ``inet_pton`` is strict (no leading zeros, no spaces) and runs in C: a plan with
    100,000 members checks each address in about a microsecond."""
    if not text.isascii() or "%" in text:
        return None
    try:
        if ":" in text:
            return socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, text))
        socket.inet_pton(socket.AF_INET, text)
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return None
    return text


def _parse_pool(reader: _Reader, item: object, path: str) -> Pool | None:
    raw = reader.mapping(
        item,
        path,
        required=("name", "members"),
        optional=("k", "ttl_floor", "fallback", "networks", "geoip"),
    )
    if raw is None:
        return None
    before = len(reader.problems)
    name = reader.name(raw.get("name"), f"{path}.name")
    k = reader.integer(raw.get("k", 4), f"{path}.k", 1, MAX_K)
    ttl_floor = reader.integer(raw.get("ttl_floor", 5), f"{path}.ttl_floor", 0, MAX_TTL)
    fallback = reader.choice(
        raw.get("fallback", Fallback.FAIL_OPEN.value), f"{path}.fallback", Fallback
    )
    members: list[Member] = []
    for index, value in enumerate(reader.items(raw.get("members", []), f"{path}.members")):
        if reader.pace is not None and index % 32 == 31:
            reader.pace()
        member = _parse_member(reader, value, f"{path}.members[{index}]")
        if member is not None:
            members.append(member)
    _check_unique(reader, [m.id for m in members], f"{path}.members", "id", "member id")
    _check_unique(reader, [m.address for m in members], f"{path}.members", "address", "address")
    networks = _parse_networks(reader, raw.get("networks", []), f"{path}.networks")
    geoip = _parse_geoip(reader, raw["geoip"], f"{path}.geoip") if "geoip" in raw else None
    if len(reader.problems) > before or name is None or k is None or ttl_floor is None:
        return None
    if fallback is None:
        return None
    return Pool(
        name=name,
        members=tuple(members),
        k=k,
        ttl_floor=ttl_floor,
        fallback=fallback,
        networks=networks,
        geoip=geoip,
    )


def _parse_geoip(reader: _Reader, value: object, path: str) -> GeoIp | None:
    raw = reader.mapping(value, path, required=("database", "locations"))
    if raw is None:
        return None
    before = len(reader.problems)
    database = reader.text(raw.get("database"), f"{path}.database", limit=MAX_GEOIP_PATH)
    if database is not None and (problem := geoip_path_problem(database)):
        reader.fail(f"{path}.database", problem)
    codes = raw.get("locations")
    if not isinstance(codes, Mapping):
        reader.fail(f"{path}.locations", f"must be an object, not {_kind(codes)}")
        return None
    if len(codes) > MAX_GEOIP_CODES:
        reader.fail(f"{path}.locations", f"must name at most {MAX_GEOIP_CODES}, not {len(codes)}")
        return None
    pairs = []
    for code, location in codes.items():
        here = _join(f"{path}.locations", _key(code))
        if not isinstance(code, str) or not GEOIP_CODE.match(code):
            reader.fail(here, "must be a country (FR) or a region (US-CA) in upper case")
            continue
        text = reader.text(location, here, limit=32)
        if text is not None and (problem := location_problem(text)):
            reader.fail(here, problem)
        elif text is not None:
            pairs.append((code, text))
    if len(reader.problems) > before or database is None:
        return None
    return GeoIp(database=database, locations=tuple(sorted(pairs)))


def location_problem(text: str) -> str | None:
    """Why ``text`` cannot be a location's name, or None."""
    if LOCATION.match(text):
        return None
    return "must be 1 to 32 of a-z, 0-9, '-' and '_', starting with a letter or a digit"


def geoip_path_problem(text: str) -> str | None:
    """Why ``text`` cannot name a MaxMind-format database, or None: an absolute path of plain
    characters ending in ``.mmdb``, with no ``..`` in it. The pipe backends open what a plan
    names: a path that cannot name a device, a pipe or a file of /proc by mistake or malice."""
    if not text.startswith("/"):
        return f"{show(text)} must be an absolute path"
    if len(text) > MAX_GEOIP_PATH:
        return f"must be at most {MAX_GEOIP_PATH} characters, not {len(text)}"
    if not GEOIP_PATH.fullmatch(text) or "/../" in f"{text}/" or "//" in text:
        return (
            f"{show(text)} must be a path ending in .mmdb, of letters, digits and . _ / + @ -, "
            "with no '..' or '//' in it"
        )
    return None


def network_problem(text: str) -> str | None:
    """Why ``text`` cannot be a client network (``10.0.0.0/8``, ``2001:db8::/32``), or None."""
    if not text.isascii() or "/" not in text:
        return f"{show(text)} is not a network: an address and a prefix length (10.0.0.0/8)"
    try:
        ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        return f"{show(text)} is not a network: {exc}"
    return None


def _parse_networks(reader: _Reader, value: object, path: str) -> tuple[Network, ...]:
    items = reader.items(value, path)
    if len(items) > MAX_NETWORKS:
        reader.fail(path, f"must hold at most {MAX_NETWORKS} networks, not {len(items)}")
        return ()
    networks: list[Network] = []
    for index, item in enumerate(items):
        here = f"{path}[{index}]"
        raw = reader.mapping(item, here, required=("network", "location"))
        if raw is None:
            continue
        network = reader.text(raw.get("network"), f"{here}.network", limit=64)
        location = reader.text(raw.get("location"), f"{here}.location", limit=32)
        problem = None if network is None else network_problem(network)
        if problem:
            reader.fail(f"{here}.network", problem)
        elif network is not None:
            network = str(ipaddress.ip_network(network))
        if location is not None and (problem := location_problem(location)):
            reader.fail(f"{here}.location", problem)
            location = None
        if network is not None and location is not None:
            networks.append(Network(network=network, location=location))
    _check_unique(reader, [n.network for n in networks], path, "network", "network")
    return tuple(networks)


_MEMBER_FIELDS = frozenset(("id", "address", "weight", "ttl", "state", "utilization", "location"))
_MEMBER_STATES = {state.value: state for state in MemberState}


def _parse_member(reader: _Reader, item: object, path: str) -> Member | None:
    """A member read by the rules below; the usual member (an object of the plan writer's own
    types, every value plainly valid) takes :func:`_usual_member`, the same rules in fewer
    steps, which accepts only what the long way accepts (a test holds the two equal)."""
    member = _usual_member(item)
    return member if member is not None else _parse_member_in_full(reader, item, path)


def _usual_member(item: object) -> Member | None:
    """``item`` as a member when it is one by every rule of :func:`_parse_member_in_full` and
    of the exact types a plan writer gives (floats for weight and utilization, an int TTL, a
    state's name); None otherwise (then read the long way, which words the problems). A plan
    with tens of thousands of members is mostly these: checked here in a few microseconds."""
    if type(item) is not dict or not item.keys() <= _MEMBER_FIELDS:
        return None
    member_id = item.get("id")
    address = item.get("address")
    weight = item.get("weight", 1.0)
    ttl = item.get("ttl", 60)
    state = item.get("state", "active")
    utilization = item.get("utilization", 0.0)
    location = item.get("location")
    if not (
        type(member_id) is str
        and 0 < len(member_id) <= MAX_ID_LENGTH
        and not _FORBIDDEN.search(member_id)
        and type(address) is str
        and type(weight) is float
        and 0.0 <= weight <= MAX_WEIGHT
        and type(ttl) is int
        and 0 <= ttl <= MAX_TTL
        and type(state) is str
        and type(utilization) is float
        and 0.0 <= utilization <= MAX_UTILIZATION
        and (location is None or (type(location) is str and LOCATION.match(location)))
    ):
        return None
    member_state = _MEMBER_STATES.get(state)
    normal = _address(address)
    if member_state is None or normal is None:
        return None
    # positional, in the order of Member's fields: a third faster than keywords, at 10**5
    return Member(member_id, normal, weight, ttl, member_state, utilization, location)


def _parse_member_in_full(reader: _Reader, item: object, path: str) -> Member | None:
    raw = reader.mapping(
        item,
        path,
        required=("id", "address"),
        optional=("weight", "ttl", "state", "utilization", "location"),
    )
    if raw is None:
        return None
    before = len(reader.problems)
    member_id = reader.text(raw.get("id"), f"{path}.id", limit=MAX_ID_LENGTH)
    address = None
    if "address" in raw:
        address = _address(raw["address"]) if isinstance(raw["address"], str) else None
        if address is None:
            reader.fail(f"{path}.address", "not an IP address (IPv6 without a %scope)")
    weight = reader.number(raw.get("weight", 1.0), f"{path}.weight", 0.0, MAX_WEIGHT)
    ttl = reader.integer(raw.get("ttl", 60), f"{path}.ttl", 0, MAX_TTL)
    state = reader.choice(raw.get("state", MemberState.ACTIVE.value), f"{path}.state", MemberState)
    utilization = reader.number(
        raw.get("utilization", 0.0), f"{path}.utilization", 0.0, MAX_UTILIZATION
    )
    if len(reader.problems) > before or member_id is None or address is None or weight is None:
        return None
    location = None
    if raw.get("location") is not None:
        location = reader.text(raw["location"], f"{path}.location", limit=32)
        if location is not None and (problem := location_problem(location)):
            reader.fail(f"{path}.location", problem)
            return None
    if ttl is None or state is None or utilization is None:
        return None
    if raw.get("location") is not None and location is None:
        return None
    return Member(
        id=member_id,
        address=address,
        weight=weight,
        ttl=ttl,
        state=state,
        utilization=utilization,
        location=location,
    )


def address_problem(text: str) -> str | None:
    """Why ``text`` cannot be a member's address in a plan, or None when it can."""
    return None if _address(text) is not None else f"{show(text)} is not an IP address"


def member_problems(member: Member) -> list[str]:
    """Every reason a pipe backend's parser would refuse ``member`` (none: it would accept it),
    by the parser's own rules; the manager checks each member of a plan it builds so that one
    bad server leaves only itself out."""
    reader = _Reader()
    _parse_member(reader, _member_to_dict(member), "member")
    return reader.problems


def normal_address(text: str) -> str:
    """The text form of an IP address a plan carries (``2001:DB8::1`` -> ``2001:db8::1``);
    raises ``ValueError`` for what :func:`address_problem` refuses."""
    address = _address(text)
    if address is None:
        raise ValueError(f"{show(text)} is not an IP address")
    return address


def _member_to_dict(member: Member) -> dict[str, Any]:
    # ``location`` and a pool's ``networks`` are written only when set: a plan without
    # topology stays readable by pipe backends that predate it (they refuse unknown keys).
    location = {"location": member.location} if member.location is not None else {}
    return {
        "id": member.id,
        "address": member.address,
        "weight": member.weight,
        "ttl": member.ttl,
        "state": member.state,
        "utilization": member.utilization,
        **location,
    }


def _networks_to_dict(pool: Pool) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if pool.networks:
        result["networks"] = [{"network": n.network, "location": n.location} for n in pool.networks]
    if pool.geoip is not None:
        result["geoip"] = {"database": pool.geoip.database, "locations": dict(pool.geoip.locations)}
    return result


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON-ready document that :func:`parse_plan` reads back unchanged.

    ``epoch`` is written only when not 0, so that a single manager's plans stay readable by
    pipe backends that predate it (they refuse unknown keys)."""
    epoch = {"epoch": plan.epoch} if plan.epoch else {}
    return {
        "format": FORMAT,
        "version": plan.version,
        **epoch,
        "generated_at": plan.generated_at,
        "stale_after": plan.stale_after,
        "zones": [
            {
                "name": zone.name,
                "soa": {
                    "mname": zone.soa.mname,
                    "rname": zone.soa.rname,
                    "serial": zone.soa.serial,
                    "refresh": zone.soa.refresh,
                    "retry": zone.soa.retry,
                    "expire": zone.soa.expire,
                    "minimum": zone.soa.minimum,
                    "ttl": zone.soa.ttl,
                },
                "ns": list(zone.ns),
                "ns_ttl": zone.ns_ttl,
                "records": [
                    {"name": r.name, "type": r.type, "ttl": r.ttl, "content": r.content}
                    for r in zone.records
                ],
            }
            for zone in plan.zones
        ],
        "pools": [_pool_to_dict(pool) for pool in plan.pools],  # last: see PlanEncoder
    }


def _pool_to_dict(pool: Pool) -> dict[str, Any]:
    return {
        "name": pool.name,
        "k": pool.k,
        "ttl_floor": pool.ttl_floor,
        "fallback": pool.fallback,  # a StrEnum is a str: JSON writes its value
        "members": [_member_to_dict(member) for member in pool.members],
        **_networks_to_dict(pool),
    }


def plan_to_json(plan: Plan) -> str:
    """The plan as compact JSON text with a trailing newline."""
    return json.dumps(plan_to_dict(plan), separators=(",", ":")) + "\n"


class PlanEncoder:
    """:func:`plan_to_json`, with each pool's text kept from the last plan encoded: a pool
    object written again (the manager publishes the pools whose answers did not move as the
    same objects, and every plan again when it is due) is not serialized again. Compact JSON
    text is made of its items' texts, so the result is byte for byte :func:`plan_to_json`'s
    (a test holds it). Serializing every pool of a 10,000-member plan took 30 ms of the
    manager's tick, each time its plan was due again."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[Pool, str]] = {}  # by id(pool): the pool keeps it alive

    def encode(self, plan: Plan) -> str:
        kept = self._texts
        texts: dict[int, tuple[Pool, str]] = {}
        parts = []
        for pool in plan.pools:
            found = kept.get(id(pool))
            if found is not None and found[0] is pool:
                text = found[1]
            else:
                text = json.dumps(_pool_to_dict(pool), separators=(",", ":"))
            texts[id(pool)] = (pool, text)
            parts.append(text)
        self._texts = texts
        head = json.dumps(plan_to_dict(dataclasses.replace(plan, pools=())), separators=(",", ":"))
        if not head.endswith('"pools":[]}'):  # pools must be the document's last key
            return plan_to_json(plan)
        return f"{head[:-2]}{','.join(parts)}]}}\n"


class PoolCache:
    """The pools of the last plan read, by the exact JSON text each was read from.

    :func:`parse_plan_json` given a cache reads the plan's top level and its pools one by one,
    and validates only the pools whose text it has not seen: a pool whose text is byte for byte
    one already validated gives the same :class:`Pool`, so the reader checks what it reuses by
    comparing the text itself and trusts nothing a writer claims. A pool at the same place as
    in the last plan is compared without decoding it (a JSON object ends at its own closing
    brace, so the old text found at that place is the whole item); any other is decoded, and
    validated unless its text is known. The cache holds the last good plan's pool texts (about
    the plan's size), replaced whole after each plan that parsed; one reader at a time.
    """

    def __init__(self) -> None:
        self.pools: dict[str, Pool] = {}
        self.order: list[str] = []  # the last plan's pool texts in its order
        self.reused = 0  # pools the last plan took from the cache (for tests and benchmarks)
        # Called after each pool read, and each validated anew: a reader on a thread may rest there
        # (the pipe backend's loader paces itself so that its query loop keeps a CPU).
        self.pace: Callable[[], None] | None = None


_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, at: int) -> int:
    """Where the JSON whitespace starting at ``at`` ends."""
    match = _WHITESPACE.match(text, at)
    return match.end() if match else at


@dataclass(slots=True)
class _Split:
    document: dict[str, Any]  # the plan document, its pools None where ``known`` has one
    spans: list[str]  # each pool item's JSON text
    known: list[Pool | None]  # the pool each item was already read as


def _split_pools(text: str, cache: PoolCache) -> _Split | None:
    """The plan document read with ``cache``; None for anything but an object holding a pools
    list, without duplicate keys, of valid JSON: the caller then reads the text whole and words
    the errors as without a cache."""
    decode = _DECODER.raw_decode
    document: dict[str, Any] = {}
    split: _Split | None = None
    try:
        at = _skip(text, 0)
        if text[at : at + 1] != "{":
            return None
        at = _skip(text, at + 1)
        if text[at : at + 1] == "}":
            return None
        while True:
            key, at = decode(text, at)
            if not isinstance(key, str) or key in document:
                return None
            at = _skip(text, at)
            if text[at : at + 1] != ":":
                return None
            at = _skip(text, at + 1)
            if key == "pools" and text[at : at + 1] == "[":
                split = _Split(document, [], [])
                at = _split_items(text, _skip(text, at + 1), cache, split)
                if at < 0:
                    return None
                value: Any = split.document.pop("pools")
            else:
                value, at = decode(text, at)
            document[key] = value
            at = _skip(text, at)
            if text[at : at + 1] == "}":
                break
            if text[at : at + 1] != ",":
                return None
            at = _skip(text, at + 1)
        if _skip(text, at + 1) != len(text):
            return None
    except (ValueError, RecursionError):
        return None
    return split


def _split_items(text: str, at: int, cache: PoolCache, split: _Split) -> int:
    """Read the pools list's items from ``at`` (after its ``[``) into ``split``; where the list
    ends, or -1 when it is not a list of JSON values. Raises ``ValueError`` like the decoder."""
    items: list[Any] = []
    split.document["pools"] = items
    while text[at : at + 1] != "]":
        if items:
            if text[at : at + 1] != ",":
                return -1
            at = _skip(text, at + 1)
        index = len(items)
        same = cache.order[index] if index < len(cache.order) else None
        if same is not None and text.startswith(same, at):
            span, end = same, at + len(same)
            pool = cache.pools.get(span)
            value = None if pool is not None else _DECODER.decode(span)
        else:  # decoded strictly once; a pool known by its text (moved) is taken from the cache
            value, end = _DECODER.raw_decode(text, at)
            span = text[at:end]
            pool = cache.pools.get(span)
        if cache.pace is not None:  # each item: comparing a few hundred kept ones adds up
            cache.pace()
        items.append(None if pool is not None else value)
        split.spans.append(span)
        split.known.append(pool)
        at = _skip(text, end)
    return at + 1


def parse_plan_json(text: str | bytes, *, cache: PoolCache | None = None) -> Plan:
    """Decode JSON text and validate it as a plan; every failure is a :class:`PlanError`.

    With ``cache``, pools whose JSON text is unchanged since the last plan read with the same
    cache are taken from it instead of validated again (:class:`PoolCache`); the result is the
    same plan, or the same error.
    """
    if cache is not None:
        try:
            decoded = text.decode("utf-8") if isinstance(text, bytes) else text
        except UnicodeDecodeError:
            decoded = None
        split = _split_pools(decoded, cache) if decoded is not None else None
        if split is not None:
            plan = parse_plan(split.document, known=split.known, pace=cache.pace)
            cache.pools = dict(zip(split.spans, plan.pools, strict=True))
            cache.order = split.spans
            cache.reused = sum(pool is not None for pool in split.known)
            return plan
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and duplicate keys
        raise PlanError("invalid plan", [f"not valid JSON: {exc}"]) from None
    except RecursionError:
        raise PlanError("invalid plan", ["not valid JSON: nested too deeply"]) from None
    return parse_plan(document)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {show(key)}")
        result[key] = value
    return result


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys)  # as json.loads decodes plans


__all__ = [
    "FORMAT",
    "MAX_EPOCH",
    "Fallback",
    "GeoIp",
    "Member",
    "MemberState",
    "Network",
    "Plan",
    "Pool",
    "PoolCache",
    "Record",
    "Soa",
    "Zone",
    "address_problem",
    "location_problem",
    "member_problems",
    "network_problem",
    "normal_address",
    "parse_plan",
    "parse_plan_json",
    "plan_to_dict",
    "plan_to_json",
]
