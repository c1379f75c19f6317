"""A plan compiled into ready replies: everything a query needs is computed here, once per plan.

:func:`compile_plan` turns a :class:`~dnslb.plan.Plan` into an :class:`AnswerTable`: per lower-case
name and query type either fixed fragments (SOA, NS, static records) or an endless iterator of
fragments (load-balanced names: the pool's answer cycle from :func:`dnslb.selection.pool_answers`,
walked by :func:`dnslb.selection.rotation`). Answering a query is then a dict lookup, ``next()``
and one ``bytes.join``.

A pool with client ``networks`` (:mod:`dnslb.topology`) gets, per query type, a :class:`Located`
reply: one answer cycle per client location (the pool with its weights scaled by the location's
shares) and the location-blind cycle for clients of no location; the query's client subnet picks
the cycle and sets the answer's ECS scope.
"""

from __future__ import annotations

import functools
import logging
import os
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field

from dnslb.geoip import GeoIpDatabase, GeoIpError, database_file
from dnslb.plan import MemberState, Plan, Pool
from dnslb.selection import (
    PACE_STEPS,
    Answer,
    Pace,
    PoolAnswers,
    answer_counts,
    answers_held,
    family_answers,
    family_key,
    family_members,
    rotation,
)
from dnslb.topology import NetworkTable, located_pool, location_shares
from pipe_backend import explain as explanation
from pipe_backend.protocol import (
    DYNAMIC_SCOPE,
    END,
    Fragments,
    Rdata,
    concat,
    data_line,
    fragments,
)

DYNAMIC_DATA = b"DATA\t%d\t1\t" % DYNAMIC_SCOPE
"""How a load-balanced record's DATA line starts (ABI 3+): its scope bits are set per query."""


MAX_SEEN_SUBNETS = 65_536
"""Client subnets a located reply remembers the lookup of (per pool and query type)."""


@dataclass(frozen=True, slots=True)
class Located:
    """A located pool's replies to one query type: the client's location picks the cycle."""

    table: NetworkTable
    cycles: tuple[Iterator[Fragments], ...]  # per location of the table
    default: Iterator[Fragments]  # clients of no location: the location-blind cycle
    # Lookups by the request's subnet field: a resolver sends the same few subnets again and
    # again. Emptied when full, so random subnets cost memory no more than this.
    seen: dict[bytes, tuple[Iterator[Fragments], bytes | None]] = field(default_factory=dict)

    def reply(self, qname: bytes, subnet: bytes, ecs: bool) -> bytes:
        """The next answer for a client in ``subnet`` (the request's ``edns-subnet`` field);
        with ``ecs`` (the query carried a client subnet) its scope is the prefix that decided
        the location, at least :data:`~pipe_backend.protocol.DYNAMIC_SCOPE`. Without, the
        scope bits only keep pdns from caching the answer."""
        found = self.seen.get(subnet)
        if found is None:
            location, scope = self.table.lookup_subnet(subnet)
            cycle = self.default if location < 0 else self.cycles[location]
            prefix = b"DATA\t%d\t1\t" % scope if scope > DYNAMIC_SCOPE else None
            if len(self.seen) >= MAX_SEEN_SUBNETS:
                self.seen.clear()
            found = self.seen[subnet] = (cycle, prefix)
        cycle, prefix = found
        reply = qname.join(next(cycle))
        if ecs and prefix is not None:
            return reply.replace(DYNAMIC_DATA, prefix)
        return reply


log = logging.getLogger("dnslb.pipe_backend")

Reply = Fragments | Iterator[Fragments] | Located
"""Fixed fragments, an iterator giving the next answer's fragments at each query, or a
:class:`Located` choosing among iterators by the client's location."""

Family = tuple[tuple[Answer, ...], list[Fragments]]
"""One address family's answer cycle and each answer's fragments."""


PoolKey = tuple[Pool, int, bool, int, tuple[tuple[bytes, Reply], ...]]
"""What a pool's compiled replies depend on: the pool, the ABI, staleness, its zone id and the
static records at its name."""


@dataclass(slots=True)
class CompiledPool:
    """A pool's replies, and how often each position of its answer cycles was given out."""

    name: str
    replies: dict[bytes, Reply]
    # Per answer cycle given out: its address family (A, AAAA), its answers, how often each
    # position was given.
    counters: list[tuple[str, tuple[Answer, ...], list[int]]] = field(default_factory=list)
    explain: tuple[str, ...] = ()  # its members as the debug TXT says them (when on)
    transfer: bytes = b""  # its active members' DATA lines in a zone transfer
    transfer_key: Hashable = None  # what ``transfer`` was made from (_transfer_lines)
    # Its answer cycles and their fragments by what they were computed from (_family): the next
    # plan's version of the pool takes those whose inputs did not change.
    families: dict[Hashable, Family] = field(default_factory=dict)
    key: PoolKey | None = None  # what it was compiled from: the same next time, it is reused

    def answer_counts(self) -> dict[str, tuple[int, int]]:
        """Per member id: (answers it came first in, answers it was in), over every query type."""
        totals: dict[str, tuple[int, int]] = {}
        for _, answers, counts in self.counters:
            for member, (first, seen) in answer_counts(answers, counts).items():
                old_first, old_seen = totals.get(member, (0, 0))
                totals[member] = (old_first + first, old_seen + seen)
        return totals

    def answers_held(self) -> dict[str, tuple[int, int]]:
        """Per address family, ``A`` and ``AAAA``: (answers with addresses given out, the
        seconds they were held for: :func:`~dnslb.selection.answers_held`). pdns asks a
        backend ``ANY`` for most queries: those count in the family of each cycle they take an
        answer of."""
        totals: dict[str, tuple[int, int]] = {}
        for family, answers, counts in self.counters:
            given, held = answers_held(answers, counts)
            old_given, old_held = totals.get(family, (0, 0))
            totals[family] = (old_given + given, old_held + held)
        return totals


@dataclass(slots=True)
class AnswerTable:
    """Replies by name (lower case bytes) and query type, and zone transfers by zone id."""

    names: dict[bytes, dict[bytes, Reply]]
    transfers: dict[int, bytes]
    zone_names: dict[int, bytes]
    pools: dict[str, CompiledPool] = field(default_factory=dict)  # by pool name


def compile_plan(
    plan: Plan,
    abi: int,
    *,
    stale: bool,
    rng: random.Random,
    previous: AnswerTable | None = None,
    explain: bool = False,
    pace: Callable[[], None] | None = None,
) -> AnswerTable:
    """Compile ``plan`` for PowerDNS ABI version ``abi``; ``pace``, if given, is called after
    each pool compiled anew (the loader's chance to rest: see :class:`pipe_backend.backend`).

    Pools unchanged since ``previous`` (same members, same ABI and staleness) keep their compiled
    replies and their place in the cycle, so a plan that only refreshed its age costs little. A
    changed pool takes from its ``previous`` version the answer cycles whose inputs are the same
    (:func:`dnslb.selection.family_key`: weights that quantize to the same slots, the same ids,
    addresses, states and TTLs), which is most of them when the manager only moved weights and
    utilizations a little; those cycles start again at a random place.
    With ``explain``, each pool also answers TXT at ``_dnslb-explain.<name>``
    (:mod:`pipe_backend.explain`), unless the plan has a record of its own there.
    """
    static: dict[str, list[tuple[Rdata, int]]] = defaultdict(list)
    transfers: dict[int, list[bytes]] = defaultdict(list)
    zone_names: dict[int, bytes] = {}
    for zone_id, zone in enumerate(plan.zones, start=1):
        zone_names[zone_id] = zone.name.encode("ascii")
        apex = [Rdata("SOA", zone.soa.ttl, zone.soa.content())]
        apex += [Rdata("NS", zone.ns_ttl, ns) for ns in zone.ns]
        for rdata in apex:
            static[zone.name].append((rdata, zone_id))
            transfers[zone_id].append(data_line(abi, zone.name, rdata, zone_id))
        for record in zone.records:
            rdata = Rdata(record.type, record.ttl, record.content)
            static[record.name].append((rdata, zone_id))
            transfers[zone_id].append(data_line(abi, record.name, rdata, zone_id))

    names: dict[bytes, dict[bytes, Reply]] = {}
    for name, records in static.items():
        names[name.encode("ascii")] = _static_replies(abi, records)

    compiled_pools: dict[str, CompiledPool] = {}
    old_pools = previous.pools if previous is not None else {}
    for pool in plan.pools:
        zone_id = plan.zone_of(pool.name) or 0
        prefix = names.get(pool.name.encode("ascii"), {})
        key = (pool, abi, stale, zone_id, tuple(prefix.items()))
        before = old_pools.get(pool.name)
        # Compared, never hashed: a pool the plan store kept is the same object (compared by
        # identity), and hashing each pool's members cost more than the rest of a plan that
        # changed a little (dataclass hashes are not cached).
        if before is not None and before.key == key:
            compiled = before
        else:
            compiled = _compile_pool(
                abi,
                pool,
                zone_id,
                prefix,
                stale=stale,
                rng=rng,
                explain=explain,
                families=before.families if before is not None else None,
                pace=pace,
            )
            compiled.transfer_key, compiled.transfer = _transfer_lines(abi, pool, zone_id, before)
            compiled.key = key
            if pace is not None:
                pace()
        compiled_pools[pool.name] = compiled
        names[pool.name.encode("ascii")] = compiled.replies
        if explain:
            _add_explanation(names, abi, plan, pool, compiled, zone_id=zone_id, stale=stale)
        transfers[zone_id].append(compiled.transfer)

    return AnswerTable(
        names=names,
        transfers={zone_id: b"".join(lines) + END for zone_id, lines in transfers.items()},
        zone_names=zone_names,
        pools=compiled_pools,
    )


def _static_replies(abi: int, records: list[tuple[Rdata, int]]) -> dict[bytes, Reply]:
    by_type: dict[str, list[tuple[Rdata, int]]] = defaultdict(list)
    for rdata, zone_id in records:
        by_type[rdata.type].append((rdata, zone_id))
    replies: dict[bytes, Reply] = {}
    for rtype, typed in by_type.items():
        replies[rtype.encode("ascii")] = _join_zones(abi, typed)
    replies[b"ANY"] = _join_zones(abi, records)
    return replies


def _join_zones(abi: int, records: list[tuple[Rdata, int]]) -> Fragments:
    """Fragments of records that may come from different zones (a zone apex below another)."""
    result: Fragments = (END,)
    for rdata, zone_id in reversed(records):
        result = concat(fragments(abi, (rdata,), zone_id, end=False), result)
    return result


def _compile_pool(
    abi: int,
    pool: Pool,
    zone_id: int,
    static: dict[bytes, Reply],
    *,
    stale: bool,
    rng: random.Random,
    explain: bool = False,
    families: dict[Hashable, Family] | None = None,
    pace: Pace = None,
) -> CompiledPool:
    """Replies of a load-balanced name: A, AAAA and ANY cycles, after any static records;
    per client location with ``networks`` and ABI 3+ (before it pdns caches every answer, so
    no answer may depend on the client). ``families``: the previous version's cycles; ``pace``
    is called while cycles are computed (:func:`dnslb.selection.cycle_answers`)."""
    previous = families if families is not None else {}
    compiled = _compile_cycles(
        abi,
        pool,
        zone_id,
        static,
        stale=stale,
        rng=rng,
        explain=explain,
        previous=previous,
        pace=pace,
    )
    if (not pool.networks and pool.geoip is None) or abi < 3:
        return compiled
    table = NetworkTable(pool.networks, _open_geoip(pool))
    shares = location_shares(pool)
    located = []
    for location in table.locations:
        local = located_pool(pool, shares.get(location, {location: 1.0}))
        located.append(
            _compile_cycles(
                abi, local, zone_id, static, stale=stale, rng=rng, previous=previous, pace=pace
            )
        )
        compiled.counters += located[-1].counters
        compiled.families.update(located[-1].families)
    for rtype in (b"A", b"AAAA", b"ANY"):
        cycles = tuple(_iterator(sub.replies[rtype]) for sub in located)
        compiled.replies[rtype] = Located(table, cycles, _iterator(compiled.replies[rtype]))
    return compiled


_GEOIP_KEPT = 16  # databases kept open between plans (a plan names a few, the same each time)
_geoip_open: dict[tuple[str, tuple[tuple[str, str], ...]], GeoIpDatabase] = {}


def _open_geoip(pool: Pool) -> GeoIpDatabase | None:
    """The pool's database, or None (logged) when it cannot be read: its clients are then
    located by the networks alone, and the plan is served all the same. A database opened for
    an earlier plan is used again while its file is the same one (replaced: opened again)."""
    if pool.geoip is None:
        return None
    key = (pool.geoip.database, pool.geoip.locations)
    try:
        kept = _geoip_open.get(key)
        if kept is not None and _same_file(database_file(key[0]), kept.status):
            return kept
        opened = GeoIpDatabase(*key)
    except GeoIpError as exc:
        log.error("pool %s: %s; locating its clients by its networks alone", pool.name, exc)
        return None
    _geoip_open.pop(key, None)
    while len(_geoip_open) >= _GEOIP_KEPT:
        del _geoip_open[next(iter(_geoip_open))]  # the oldest (a table may still hold it)
    _geoip_open[key] = opened
    return opened


def _same_file(now: os.stat_result, then: os.stat_result) -> bool:
    return (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) == (
        then.st_dev,
        then.st_ino,
        then.st_size,
        then.st_mtime_ns,
    )


def _iterator(reply: Reply) -> Iterator[Fragments]:
    assert not isinstance(reply, tuple | Located), "a pool's A, AAAA, ANY replies are cycles"
    return reply


def _compile_cycles(
    abi: int,
    pool: Pool,
    zone_id: int,
    static: dict[bytes, Reply],
    *,
    stale: bool,
    rng: random.Random,
    explain: bool = False,
    previous: dict[Hashable, Family],
    pace: Pace = None,
) -> CompiledPool:
    compiled = CompiledPool(name=pool.name, replies=dict(static))
    kept = compiled.families
    family = functools.partial(
        _family, abi, pool, zone_id, stale=stale, previous=previous, kept=kept, pace=pace
    )
    v4_answers, v4 = family("A")
    v6_answers, v6 = family("AAAA")
    answers = PoolAnswers(v4=v4_answers, v6=v6_answers)
    if explain:
        compiled.explain = explanation.member_lines(pool, answers)

    def counted(items: list[Fragments], v6: bool = False) -> Iterator[Fragments]:
        counts = [0] * len(items)
        family = answers.v6 if v6 else answers.v4
        compiled.counters.append(("AAAA" if v6 else "A", family, counts))
        return rotation(items, random.Random(rng.getrandbits(64)), counts)

    # The plan never holds static A, AAAA or CNAME records at a pool's name.
    compiled.replies[b"A"] = counted(v4)
    compiled.replies[b"AAAA"] = counted(v6, v6=True)
    any_static = static.get(b"ANY")
    has_v4 = any(answer.members for answer in answers.v4)
    has_v6 = any(answer.members for answer in answers.v6)
    if has_v4 and has_v6:
        # Two cycles of different lengths: each query takes the next answer of both.
        first = counted(_with_static(any_static, [_open(f) for f in v4]))
        compiled.replies[b"ANY"] = map(concat, first, counted(v6, v6=True))
    elif has_v6:
        compiled.replies[b"ANY"] = counted(_with_static(any_static, v6), v6=True)
    elif has_v4 or any_static is not None:
        compiled.replies[b"ANY"] = counted(_with_static(any_static, v4))
    else:
        compiled.replies[b"ANY"] = counted([_no_address(abi, pool, zone_id)] * len(v4))
    return compiled


def _family(
    abi: int,
    pool: Pool,
    zone_id: int,
    rtype: str,
    *,
    stale: bool,
    previous: dict[Hashable, Family],
    kept: dict[Hashable, Family],
    pace: Pace = None,
) -> Family:
    """The answer cycle of ``pool``'s members of one address family and its fragments: the
    previous version's when its inputs are the same, else computed (the costly part of a plan:
    scheduling a cycle of a few hundred answers per pool). Kept in ``kept`` for the next."""
    members = family_members(pool, ipv6=rtype == "AAAA")
    key = (abi, zone_id, rtype, family_key(members, pool, stale=stale))
    family = previous.get(key)
    if family is None:
        answers = family_answers(members, pool, stale=stale, pace=pace)
        family = (answers, _cycle_fragments(abi, answers, zone_id, rtype, pace))
    kept[key] = family
    return family


NO_ADDRESS = '"no server can take requests now (dnslb)"'


def _no_address(abi: int, pool: Pool, zone_id: int) -> Fragments:
    """The ANY reply of a pool with nothing to answer (no server up yet, all paused with
    ``fallback: nodata``...): the name still exists, so that pdns answers A and AAAA queries
    with NODATA. With nothing at all, pdns answers NXDOMAIN ("no such name, nor any name below
    it"), which resolvers cache as such and may apply to every name below (RFC 8020). pdns
    4.7.3's pipe backend cannot send an empty non-terminal (its ENT needs a content field that
    ENT cannot parse), so the name holds one TXT record saying why; a TXT query gets it."""
    return fragments(abi, [Rdata("TXT", pool.ttl_floor, NO_ADDRESS, dynamic=True)], zone_id)


def _transfer_lines(
    abi: int, pool: Pool, zone_id: int, previous: CompiledPool | None
) -> tuple[Hashable, bytes]:
    """The pool's lines in a zone transfer (its active members), and what they are made from:
    ``previous``'s lines when that is the same."""
    active = [member for member in pool.members if member.state is MemberState.ACTIVE]
    ttls = [max(member.ttl, pool.ttl_floor) for member in active]
    key = (abi, pool.name, zone_id, tuple(member.address for member in active), tuple(ttls))
    if previous is not None and previous.transfer_key == key:
        return key, previous.transfer
    lines = []
    for member, ttl in zip(active, ttls, strict=True):
        rdata = Rdata("AAAA" if member.ipv6 else "A", ttl, member.address)
        lines.append(data_line(abi, pool.name, rdata, zone_id))
    return key, b"".join(lines)


def _add_explanation(
    names: dict[bytes, dict[bytes, Reply]],
    abi: int,
    plan: Plan,
    pool: Pool,
    compiled: CompiledPool,
    *,
    zone_id: int,
    stale: bool,
) -> None:
    """The pool's debug TXT record set, as a fixed reply (TTL 0, never cached)."""
    name = explanation.explain_name(pool.name)
    if name is None or name.encode("ascii") in names:
        return
    lines = (explanation.header(plan, pool, stale=stale), *compiled.explain)
    records = [Rdata("TXT", 0, explanation.txt_content(line), dynamic=True) for line in lines]
    reply = fragments(abi, records, zone_id)
    names[name.encode("ascii")] = {b"TXT": reply, b"ANY": reply}


def _cycle_fragments(
    abi: int, answers: tuple[Answer, ...], zone_id: int, rtype: str, pace: Pace = None
) -> list[Fragments]:
    """Each answer's fragments, the same bytes as :func:`~pipe_backend.protocol.fragments` of
    its records, from each record's fragment made once per address and TTL: a cycle holds a
    few hundred answers over a pool's few members and TTLs, and making every record of every
    answer anew was a quarter of the time a changed pool took to compile."""
    made: dict[tuple[str, int], Fragments] = {}  # two such records: (head, opened, closed)
    result: list[Fragments] = []
    for step, answer in enumerate(answers):
        if pace is not None and not step % PACE_STEPS:
            pace()
        if not answer.members:  # nothing to answer (fallback nodata): END alone
            result.append(fragments(abi, (), zone_id))
            continue
        records = []
        for member in answer.members:
            record = made.get((member.address, answer.ttl))
            if record is None:
                rdata = Rdata(rtype, answer.ttl, member.address, dynamic=True)
                record = made[member.address, answer.ttl] = fragments(abi, (rdata, rdata), zone_id)
            records.append(record)
        result.append((records[0][0], *[record[1] for record in records[:-1]], records[-1][2]))
    return result


def _open(reply: Fragments) -> Fragments:
    """The same reply without its closing END, to be followed by another part."""
    return (*reply[:-1], reply[-1].removesuffix(END))


def _with_static(static: Reply | None, answers: list[Fragments]) -> list[Fragments]:
    if static is None:
        return answers
    assert isinstance(static, tuple), "static replies are fixed fragments"
    return [concat(_open(static), answer) for answer in answers]


__all__ = ["AnswerTable", "CompiledPool", "Reply", "compile_plan"]
