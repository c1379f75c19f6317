"""The PowerDNS pipe protocol, ABI versions 1 to 5, as bytes.

PowerDNS writes one request per line, fields separated by tabs, and reads the reply up to ``END``
(or a single ``FAIL``)::

    HELO <abi>                                         -> OK <banner> | FAIL
    Q <qname> <qclass> <qtype> <zone-id> <remote>                       (ABI 1)
        ... <local>                                                     (ABI 2)
        ... <local> <edns-subnet>                                       (ABI 3, 4, 5)
    AXFR <zone-id>                                     (ABI 1-3)
    AXFR <zone-id> <zone-name>                         (ABI 4, 5)
    CMD <text>                                         (ABI 5; ``pdnsutil backend-cmd``)

    DATA <qname> <qclass> <qtype> <ttl> <zone-id> <content>                  (ABI 1, 2)
    DATA <scopebits> <auth> <qname> <qclass> <qtype> <ttl> <zone-id> <content>  (ABI 3-5)
    LOG <text>     END     FAIL

MX and SRV content puts the priority in a field of its own. PowerDNS 4.7 does not cache records
with non-zero scope bits, which is how dynamic answers bypass its packet and query caches (ABI 3+).

An answer is kept as *fragments*: ``qname.join(fragments)`` is the whole reply, so the query's
name (in the client's letter case) is put in with one C call per query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ABI_VERSIONS = (1, 2, 3, 4, 5)
Q_FIELDS = {1: 6, 2: 7, 3: 8, 4: 8, 5: 8}
AXFR_FIELDS = {1: 2, 2: 2, 3: 2, 4: 3, 5: 3}
MAX_LINE = 4096
"""Longest request line accepted; PowerDNS's longest (a 255-byte name in ABI 5) is far shorter."""

DYNAMIC_SCOPE = 1
"""Scope bits on load-balanced answers: non-zero, so PowerDNS does not cache them (pdns 4.7
keeps records of scope 0 in its query cache, keyed by name and type alone, and would give one
answer to every client for ``query-cache-ttl``). To a query with an EDNS Client Subnet pdns
returns the largest scope of the answer's records: 1 says the location did not matter as
broadly as pdns allows (a resolver may reuse the answer for half the address space). A located
answer replaces it by the prefix that decided the location (:class:`pipe_backend.answers.Located`).
"""

END = b"END\n"
FAIL = b"FAIL\n"

Fragments = tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Rdata:
    """One record of an answer, without its owner name."""

    type: str
    ttl: int
    content: str
    dynamic: bool = False  # load-balanced: sent with scope bits so that pdns does not cache it


def _content_fields(rtype: str, content: str) -> str:
    if rtype in ("MX", "SRV"):
        priority, _, rest = content.partition(" ")
        return f"{priority}\t{rest}"
    return content


def _prefix(abi: int, dynamic: bool) -> bytes:
    if abi < 3:
        return b"DATA\t"
    return b"DATA\t%d\t1\t" % (DYNAMIC_SCOPE if dynamic else 0)


def fragments(abi: int, records: Sequence[Rdata], zone_id: int, *, end: bool = True) -> Fragments:
    """The reply holding ``records`` for any name, as fragments to be joined with the qname.

    Without ``end`` the reply lacks its closing ``END`` (to be followed by another part).
    """
    parts = [b""]
    for record in records:
        parts[-1] += _prefix(abi, record.dynamic)
        tail = f"\tIN\t{record.type}\t{record.ttl}\t{zone_id}\t"
        tail += _content_fields(record.type, record.content) + "\n"
        parts.append(tail.encode("ascii"))
    if end:
        parts[-1] += END
    return tuple(parts)


def concat(first: Fragments, second: Fragments) -> Fragments:
    """Fragments of the reply that holds ``first``'s records and then ``second``'s."""
    return (*first[:-1], first[-1] + second[0], *second[1:])


def data_line(abi: int, owner: str, record: Rdata, zone_id: int) -> bytes:
    """One complete DATA line with an explicit owner name (zone transfers)."""
    return owner.encode("ascii").join(fragments(abi, (record,), zone_id, end=False))


def log_fail(reason: str) -> bytes:
    """A reply that logs ``reason`` in PowerDNS's log and fails the request."""
    text = reason.replace("\t", " ").replace("\n", " ")
    return b"LOG\t" + text.encode("utf-8", "replace") + b"\n" + FAIL
