"""Topology: which location a client is in, and which locations its answers come from.

A pool's ``networks`` map client networks to *locations* (a member's ``location``: a region or a
site). :class:`NetworkTable` is that map compiled once per plan: a longest-prefix match turned
into sorted, disjoint address ranges, so that a lookup is one ``bisect`` and the answer's EDNS
Client Subnet *scope* comes with it: the shortest prefix of the client's address inside which
every address gets the same location. For a client inside one entry with nothing more specific
nearby that is the entry's prefix length; for a client that matches nothing it is the prefix
that separates it from the nearest entry (an answer that scope 0 would let a resolver reuse for
clients who do match); it is 0 only when the table holds no entry of the client's family.

:func:`location_shares` says, per client location, the share of its clients each location
serves: all of them locally while the location has spare capacity, then a growing share sent
to the others by their spare capacity (the members' weights) as its utilization rises past
:data:`SPILL_AT`, and all of them when it has no active member (a regional outage).
:func:`located_pool` turns that into a pool whose weights carry the shares, so that the usual
answer cycle (:func:`dnslb.selection.pool_answers`) serves a location's clients.
"""

from __future__ import annotations

import bisect
import dataclasses
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from dnslb.geoip import GeoIpDatabase, GeoIpError
from dnslb.plan import Member, MemberState, Network, Pool

SPILL_AT = 0.75
"""A location's mean utilization above which part of its clients go to other locations: the
local share falls linearly from 1 here to 0 at utilization 1."""


@dataclass(frozen=True, slots=True)
class _Family:
    width: int  # 32 or 128
    starts: list[int]  # first address of each range, ascending, starts[0] == 0
    locations: list[int]  # the location index of each range, -1 for none


class NetworkTable:
    """A pool's networks compiled for lookups: :meth:`lookup` gives (location index, scope).

    Location indices follow :attr:`locations` (sorted names); -1 is no location. With a
    ``geoip`` database, a client no network holds is located by it: the scope is then the
    longer of the database network's prefix and the one that keeps the table's networks out.
    """

    def __init__(self, networks: Iterable[Network], geoip: GeoIpDatabase | None = None) -> None:
        entries: dict[int, list[tuple[int, int, int, str]]] = {4: [], 6: []}
        names: set[str] = set()
        for network in networks:
            parsed = ipaddress.ip_network(network.network)
            size = parsed.num_addresses
            start = int(parsed.network_address)
            entries[parsed.version].append((start, -size, start + size - 1, network.location))
            names.add(network.location)
        self.geoip = geoip
        if geoip is not None:
            names |= geoip.location_names
        self.locations: tuple[str, ...] = tuple(sorted(names))
        index = {name: number for number, name in enumerate(self.locations)}
        self._v4 = _compile(32, entries[4], index)
        self._v6 = _compile(128, entries[6], index)

    def lookup(self, address: int, v6: bool) -> tuple[int, int]:
        """(location index or -1, scope prefix length) of the client address ``address``."""
        family = self._v6 if v6 else self._v4
        starts = family.starts
        at = bisect.bisect_right(starts, address) - 1
        width = family.width
        scope = 0
        start = starts[at]
        if start:  # the range's lower neighbour must be outside the answer's scope
            scope = width - (address ^ (start - 1)).bit_length() + 1
        if at + 1 < len(starts):  # and so must its upper neighbour
            scope = max(scope, width - (address ^ starts[at + 1]).bit_length() + 1)
        return family.locations[at], scope

    def lookup_subnet(self, subnet: bytes) -> tuple[int, int]:
        """:meth:`lookup` of a pipe request's ``edns-subnet`` field (``192.0.2.0/24``); a
        source prefix of 0 or an unreadable field is a client without location, scope 0."""
        address, _, bits = subnet.partition(b"/")
        if bits == b"0":  # the client asks for no subnet to be used (RFC 7871, 7.1.2)
            return -1, 0
        try:
            text = address.decode("ascii")
            if ":" in text:
                found = self.lookup(int.from_bytes(socket.inet_pton(socket.AF_INET6, text)), True)
            else:
                found = self.lookup(int.from_bytes(socket.inet_aton(text)), False)
            if found[0] >= 0 or self.geoip is None:
                return found
            location, prefix = self.geoip.lookup(text)
        except (OSError, UnicodeDecodeError, ValueError, GeoIpError):
            return -1, 0
        index = self.locations.index(location) if location is not None else -1
        return index, max(found[1], prefix)


def _compile(
    width: int, entries: list[tuple[int, int, int, str]], index: dict[str, int]
) -> _Family:
    """Disjoint ranges covering the family, each with the location of its longest match;
    neighbours with the same location are merged (the scope then spans them both)."""
    starts = [0]
    locations = [-1]

    def mark(at: int, location: int) -> None:
        if at >= 1 << width:
            return
        if starts[-1] == at:
            starts.pop()
            locations.pop()
        if not locations or locations[-1] != location:
            starts.append(at)
            locations.append(location)

    open_blocks: list[tuple[int, int]] = []  # (last address, location): nested, innermost last
    for start, _, last, name in sorted(entries):  # by start, larger blocks first
        while open_blocks and open_blocks[-1][0] < start:
            ended, _ = open_blocks.pop()
            mark(ended + 1, open_blocks[-1][1] if open_blocks else -1)
        mark(start, index[name])
        open_blocks.append((last, index[name]))
    while open_blocks:
        ended, _ = open_blocks.pop()
        mark(ended + 1, open_blocks[-1][1] if open_blocks else -1)
    return _Family(width=width, starts=starts, locations=locations)


def pool_locations(pool: Pool) -> tuple[str, ...]:
    """Every location the pool's networks or members name, sorted."""
    names = {network.location for network in pool.networks}
    names.update(member.location for member in pool.members if member.location is not None)
    return tuple(sorted(names))


def location_shares(pool: Pool) -> dict[str, dict[str | None, float]]:
    """Per client location: the share of its clients each location serves (adding up to 1;
    ``None`` is the members without a location).

    A location keeps all of its clients while its members' mean utilization (active and
    paused ones) is at most :data:`SPILL_AT`, none above 1 or without an active member, and a
    share in between linearly; the rest goes to the other locations in proportion to their
    active members' weights, their spare capacity. With no other location able to take it, a
    location keeps its clients whatever its load.
    """
    spare: dict[str | None, float] = {}
    load: dict[str | None, list[float]] = {}
    for member in pool.members:
        if member.state is MemberState.ACTIVE:
            spare[member.location] = spare.get(member.location, 0.0) + member.weight
        if member.state in (MemberState.ACTIVE, MemberState.PAUSED):
            load.setdefault(member.location, []).append(member.utilization)
    shares: dict[str, dict[str | None, float]] = {}
    for location in pool_locations(pool):
        others = {
            other: weight for other, weight in spare.items() if other != location and weight > 0
        }
        total = sum(others.values())
        if location not in spare or not spare[location] > 0:
            local = 0.0 if total > 0 else 1.0
        else:
            loads = load.get(location, [0.0])
            utilization = sum(loads) / len(loads)
            local = min(1.0, max(0.0, (1.0 - utilization) / (1.0 - SPILL_AT)))
            if total <= 0:
                local = 1.0
        result: dict[str | None, float] = {location: local} if local > 0 else {}
        for other, weight in others.items():
            if local < 1.0:
                result[other] = (1.0 - local) * weight / total
        shares[location] = result
    return shares


def located_pool(pool: Pool, shares: dict[str | None, float]) -> Pool:
    """``pool`` with each member's weight scaled so that, within each address family, the
    locations' total weights follow ``shares`` (members of a location without a share get 0)."""
    totals: dict[tuple[str | None, bool], float] = {}
    for member in pool.members:
        if member.state is MemberState.ACTIVE:
            key = (member.location, member.ipv6)
            totals[key] = totals.get(key, 0.0) + member.weight
    members: list[Member] = []
    for member in pool.members:
        total = totals.get((member.location, member.ipv6), 0.0)
        share = shares.get(member.location, 0.0)
        weight = member.weight * share / total if total > 0 else 0.0
        members.append(dataclasses.replace(member, weight=weight))
    return dataclasses.replace(pool, members=tuple(members))


__all__ = [
    "SPILL_AT",
    "NetworkTable",
    "located_pool",
    "location_shares",
    "pool_locations",
]
