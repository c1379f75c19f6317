"""Fuzz harness for the pipe protocol: request lines as PowerDNS (or anything on the pipe) may
send them, answered by the real coprocess loop against any plan the parser accepts.

Each input is a random plan (from :func:`dnslb.fuzz_plan.random_plan_document`, the base plan
when that one is refused) and a stream of requests: ``HELO`` in every ABI and broken, ``Q`` for
the plan's names in any letter case and for others, with every field count and query type,
``AXFR``, ``CMD``, ``PING``, garbage, lines longer than the limit and CRs. The stream goes
through :meth:`~pipe_backend.backend.PipeBackend.serve`'s loop from a file, and the output is
checked reply by reply:

* exactly one reply per request line, in order, each ending with ``END`` or ``FAIL`` (or an
  ``OK`` banner for ``HELO``): PowerDNS would otherwise read one reply as another's;
* every ``DATA`` line has the ABI's field count, the request's name exactly as sent, the
  requested type (any type for ``ANY``), a TTL in range, addresses of the right family, and no
  more than ``k`` distinct addresses for a load-balanced name.
"""

from __future__ import annotations

import ipaddress
import os
import random
import tempfile
from collections.abc import Hashable
from typing import Any

from dnslb.errors import PlanError
from dnslb.fuzz_plan import random_plan_document
from dnslb.fuzzing import Finding, Harness, mutate_bytes
from dnslb.plan import MAX_TTL, Plan, parse_plan
from dnslb.plan_store import PlanStore
from pipe_backend.backend import PipeBackend
from pipe_backend.explain import LABEL
from pipe_backend.protocol import MAX_LINE, Q_FIELDS

_QTYPES = (b"A", b"AAAA", b"ANY", b"SOA", b"NS", b"MX", b"TXT", b"SRV", b"CNAME", b"CAA", b"PTR")
_REMOTE = (b"10.9.9.9", b"10.9.9.9\t127.0.0.1", b"10.9.9.9\t127.0.0.1\t10.9.9.0/24")

_BASE: dict[str, Any] = {
    "format": 1,
    "version": 1,
    "zones": [{"name": "example.test", "ns": ["ns1.example.test"]}],
    "pools": [
        {
            "name": "www.example.test",
            "k": 2,
            "members": [
                {"id": "a", "address": "10.0.0.1", "weight": 3},
                {"id": "b", "address": "10.0.0.2"},
                {"id": "c", "address": "2001:db8::1", "state": "paused"},
            ],
        }
    ],
}


class MemoryPlanStore(PlanStore):
    """A plan held in memory (the harness's store: no I/O)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def describe(self) -> str:
        return "memory"

    def publish(self, plan: Plan, *, durable: bool = True) -> None:
        self.plan = plan

    def stamp(self) -> Hashable | None:
        return self.plan.version

    def read(self) -> Plan:
        return self.plan

    def write_stats(self, name: str, document: dict[str, Any]) -> None:
        pass

    def read_stats(self, max_age: float = 86400.0) -> list[dict[str, Any]]:
        return []


def _plan(rng: random.Random) -> Plan:
    try:
        return parse_plan(random_plan_document(rng))
    except PlanError:
        return parse_plan(_BASE)


def _names(plan: Plan) -> list[bytes]:
    names = [zone.name for zone in plan.zones] + [pool.name for pool in plan.pools]
    names += [record.name for zone in plan.zones for record in zone.records]
    names += [f"{LABEL}.{pool.name}" for pool in plan.pools]  # answered with --explain
    return [name.encode("ascii") for name in names] or [b"example.test"]


def _cased(name: bytes, rng: random.Random) -> bytes:
    return bytes(c ^ 0x20 if 97 <= c <= 122 and rng.random() < 0.5 else c for c in name)


def _request(rng: random.Random, names: list[bytes], abi: int) -> bytes:
    choice = rng.random()
    if choice < 0.7:
        name = _cased(rng.choice(names), rng) if rng.random() < 0.85 else b"other.example.org"
        qtype = rng.choice(_QTYPES) if rng.random() < 0.95 else rng.choice((b"", b"a", b"TYPE1"))
        remote = _REMOTE[min(max(abi, 1), 3) - 1]
        line = b"\t".join((b"Q", name, b"IN", qtype, str(rng.choice((-1, 1, 2))).encode(), remote))
        if rng.random() < 0.05:
            line += b"\textra"
        if rng.random() < 0.1:
            line = mutate_bytes(line, rng, mutations=rng.choice((1, 3)))
        return line
    if choice < 0.77:
        zone = rng.choice((b"1", b"2", b"9", b"-1", b"x", b"9" * 40))
        return b"AXFR\t" + zone + (b"\t" + rng.choice(names) if rng.random() < 0.6 else b"")
    if choice < 0.82:
        return b"CMD\t" + rng.choice((b"status", b"help", b"reload", b"frob", b"", b"\xff\xfe"))
    if choice < 0.85:
        return rng.choice((b"PING", b"HELO\t" + str(rng.randint(0, 6)).encode(), b"HELO"))
    if choice < 0.9:
        return b"x" * rng.choice((MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 3 * MAX_LINE))
    if choice < 0.95:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))).replace(b"\n", b"")
    return rng.choice((b"", b"\r", b"Q", b"\t\t\t\t\t\t\t", b"END", b"FAIL", b"DATA\tx"))


def _replies(output: bytes) -> list[list[bytes]]:
    """The output cut into replies: lines up to ``END``, ``FAIL`` or an ``OK`` banner."""
    if output and not output.endswith(b"\n"):
        raise Finding(f"output does not end with a newline: {output[-60:]!r}")
    replies: list[list[bytes]] = []
    current: list[bytes] = []
    for line in output.split(b"\n")[:-1]:
        current.append(line)
        if line in (b"END", b"FAIL") or line.startswith(b"OK\t"):
            replies.append(current)
            current = []
    if current:
        raise Finding(f"a reply without END or FAIL: {current[:3]!r}")
    return replies


def _check_data(line: bytes, abi: int, request: list[bytes], k_of: dict[bytes, int]) -> bytes:
    fields = line.split(b"\t")
    if abi >= 3:
        if len(fields) < 9 or not fields[1].isdigit() or fields[2] not in (b"0", b"1"):
            raise Finding(f"DATA line malformed for ABI {abi}: {line[:120]!r}")
        fields = fields[3:]
    else:
        fields = fields[1:]
    if len(fields) < 6:
        raise Finding(f"DATA line with too few fields: {line[:120]!r}")
    qname, qclass, qtype, ttl, zone_id, *content = fields
    if qname != request[1]:
        raise Finding(f"DATA for {qname!r} in the reply to {request[1]!r}")
    if qclass != b"IN" or (request[3] != b"ANY" and qtype != request[3]):
        raise Finding(f"DATA of class/type {qclass!r}/{qtype!r} for a {request[3]!r} query")
    if not ttl.isdigit() or int(ttl) > MAX_TTL or not zone_id.lstrip(b"-").isdigit():
        raise Finding(f"DATA with a bad TTL or zone id: {line[:120]!r}")
    if len(content) != (2 if qtype in (b"MX", b"SRV") else 1):
        raise Finding(f"DATA with {len(content)} content fields for {qtype!r}: {line[:120]!r}")
    if qtype in (b"A", b"AAAA"):
        address = ipaddress.ip_address(content[0].decode("ascii"))
        if (address.version == 6) != (qtype == b"AAAA"):
            raise Finding(f"a {qtype!r} record holding {content[0]!r}")
    return qtype + b" " + content[-1]


class ProtocolHarness(Harness):
    name = "pipe-protocol"
    boundary = "request lines on the pipe from PowerDNS, against any plan the parser accepts"
    suite_inputs = 1500
    unit = "request lines"

    def one(self, rng: random.Random) -> str:
        plan = _plan(rng)
        names = _names(plan)
        k_of = {pool.name.encode("ascii"): pool.k for pool in plan.pools}
        abi = rng.choice((1, 2, 3, 4, 5))
        requests = [b"HELO\t%d" % abi] if rng.random() < 0.95 else []
        requests += [_request(rng, names, abi) for _ in range(rng.randint(1, 40))]
        data = b"\n".join(requests) + (b"\n" if rng.random() < 0.9 else b"")
        backend = PipeBackend(
            MemoryPlanStore(plan),
            rng=random.Random(rng.getrandbits(32)),
            explain=rng.random() < 0.5,
        )
        backend.poll(force=True)
        output = _run(backend, data)
        sent = data.split(b"\n")
        if sent[-1] == b"":
            sent.pop()
        self.units += len(sent)
        replies = _replies(output)
        if len(replies) != len(sent):
            raise Finding(f"{len(sent)} requests got {len(replies)} replies")
        current: int | None = None
        for request, reply in zip(sent, replies, strict=True):
            current = self._check(request, reply, current, k_of)
        return "served"

    def _check(
        self, request: bytes, reply: list[bytes], abi: int | None, k_of: dict[bytes, int]
    ) -> int | None:
        last = reply[-1]
        for line in reply[:-1]:
            if not line.startswith((b"LOG\t", b"DATA\t")) and not request.startswith(b"CMD"):
                raise Finding(f"reply line {line[:80]!r} to {request[:80]!r}")
        if last.startswith(b"OK\t"):
            if not request.startswith(b"HELO\t") or len(reply) != 1:
                raise Finding(f"an OK banner in reply to {request[:80]!r}")
            return int(request.split(b"\t")[1])
        fields = request.rstrip(b"\r").split(b"\t")
        data = [line for line in reply if line.startswith(b"DATA\t")]
        if data and (abi is None or fields[0] != b"Q" or len(fields) != Q_FIELDS[abi]):
            if not request.startswith(b"AXFR"):
                raise Finding(f"DATA in reply to {request[:80]!r} (ABI {abi})")
            return abi
        addresses = [_check_data(line, abi, fields, k_of) for line in data] if abi else []
        pool_k = k_of.get(fields[1].lower()) if len(fields) > 1 else None
        for qtype in (b"A ", b"AAAA "):
            answered = [a for a in addresses if a.startswith(qtype)]
            repeated = len(set(answered)) < len(answered)
            if pool_k is not None and (len(answered) > pool_k or repeated):
                raise Finding(f"{len(answered)} {qtype!r}records for k={pool_k}: {answered}")
        return abi


def _run(backend: PipeBackend, data: bytes) -> bytes:
    """``data`` through the coprocess loop, from a file into a file (no threads, no pipes)."""
    with tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as sink:
        source.write(data)
        source.seek(0)
        backend._serve(source.fileno(), sink.fileno())
        sink.seek(0)
        return sink.read()


__all__ = ["MemoryPlanStore", "ProtocolHarness"]


if __name__ == "__main__":  # pragma: no cover - a quick look at one input
    print(ProtocolHarness().one(random.Random(int(os.environ.get("SEED", "1")))))
