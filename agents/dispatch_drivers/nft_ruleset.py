"""The nftables text a node's rules are made of (pure functions; the drivers run or keep it).

The base ruleset, for a VIP of 198.51.100.10 (``render_base``)::

    table ip dnslb {
        comment "dnslb node agent for cluster vip-1"   # the agent's mark: see below
        set active { type mark; }            # this node's buckets
        set lease { type ipv4_addr; flags timeout; }   # the VIP while the agent renews it
        chain prerouting {
            type filter hook prerouting priority raw; policy accept;
            ip daddr 198.51.100.10 meta pkttype { broadcast, multicast } meta pkttype set host
        }
        chain input {
            type filter hook input priority filter; policy accept;
            ip daddr 198.51.100.10 jump vip
        }
        chain vip {
            ct state established,related accept
            jump classify
            drop
        }
        chain classify {
            ip daddr @lease tcp flags & (fin|syn|rst|ack) == syn
                meta mark set jhash ip saddr . tcp sport mod 1024 seed 0x2a
                meta mark @active socket transparent 0 accept
        }
    }

Why each piece:

* Every node receives frames sent to a multicast MAC; the kernel marks them ``multicast`` and TCP
  drops anything not marked ``host``, so prerouting re-marks packets for the VIP.
* Only **pure SYNs** may open a connection. Any other packet of a connection this node does not
  hold is dropped without a reply (no RST): it belongs to another node. With
  ``nf_conntrack_tcp_loose=0`` too, conntrack never adopts such a mid-stream packet.
* ``jhash`` writes the bucket into the packet mark and the ``type mark`` set holds this node's
  buckets (a ``typeof`` set of jhash values crashes ``nft list`` in nft 1.0.6). The mark is
  only set on SYNs to the VIP, after routing.
* ``socket transparent 0`` matches only when a socket (the service's listener) exists, so a node
  whose service is down drops the SYN instead of resetting it.
* With a lease, the rule also needs the VIP's element in the ``lease`` set, which times out unless
  the agent renews it: a node whose agent died stops taking new connections by itself, before
  the manager gives its buckets to other nodes (``ip daddr @lease`` then starts the rule).
* The set and the classify rule are replaced together in one ``nft -f`` transaction
  (``render_apply``), so there is no instant with an empty set or a rule of another seed.
* **Ownership.** The agent replaces its table whole at start, so it must never take a table it
  did not make: a table ``nft_table`` names that exists already is replaced only when it carries
  the agent's comment (:data:`OWNER_MARK`, naming the same cluster), or is a table of an agent
  from before the mark (exactly the sets and chains above, no comment). Anything else is refused
  (:func:`ownership_problem`). A new table is made with ``create table`` (which fails if one
  appeared meanwhile) and an old one deleted by its handle (which fails if it was replaced
  meanwhile), both in the same transaction as the rest, so the check cannot be raced into
  deleting someone else's table.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from dnslb.dispatch import MAX_BUCKETS, MAX_SEED

_TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_ELEMENTS_PER_LINE = 32
OWNER_MARK = "dnslb node agent"
"""The start of the comment every table the agent creates carries."""
_SAFE_OWNER = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # fits in an nft string as it is
_OUR_SETS = frozenset({"active", "lease"})
_OUR_CHAINS = frozenset({"prerouting", "input", "vip", "classify"})


def check_table_name(name: str) -> str:
    """``name`` if it is a safe nftables identifier; raises ``ValueError`` otherwise."""
    if not _TABLE_NAME.fullmatch(name):
        raise ValueError(f"nftables table name {name!r}: letters, digits and _ only, 1-32 chars")
    return name


def check_vip(vip: str) -> str:
    """``vip`` normalised if it is an IPv4 address; raises ``ValueError`` otherwise."""
    try:
        return str(ipaddress.IPv4Address(vip))
    except ValueError:
        raise ValueError(f"{vip!r} is not an IPv4 address") from None


def owner_comment(owner: str) -> str:
    """The comment of the table an agent of cluster ``owner`` creates (the cluster is left out
    when its name holds characters an nft string cannot carry as they are)."""
    if _SAFE_OWNER.fullmatch(owner):
        return f"{OWNER_MARK} for cluster {owner}"
    return OWNER_MARK


@dataclass(frozen=True, slots=True)
class TableListing:
    """What ``nft -t -a list table`` says of an existing table."""

    handle: int | None
    comment: str | None
    sets: frozenset[str]
    chains: frozenset[str]


_HEADER = re.compile(r"table \S+ \S+ \{(?: # handle (\d+))?")
_COMMENT = re.compile(r'comment "([^"]*)"')
_MEMBER = re.compile(
    r"(set|map|chain|flowtable|counter|quota|limit|ct \S+|secmark|synproxy) (\S+) \{"
)


def parse_table_listing(text: str) -> TableListing:
    """The handle, comment, sets and chains of a table listed by ``nft -t -a list table``
    (the other kinds of objects count as chains: anything not ours makes it not ours)."""
    handle: int | None = None
    comment: str | None = None
    sets: set[str] = set()
    chains: set[str] = set()
    depth = 0
    for raw in text.splitlines():
        line = raw.strip()
        if depth == 0 and (match := _HEADER.match(line)):
            handle = int(match.group(1)) if match.group(1) else None
        elif depth == 1 and (match := _COMMENT.fullmatch(line.rstrip(";"))):
            comment = match.group(1)
        elif depth == 1 and (match := _MEMBER.match(line)):
            (sets if match.group(1) == "set" else chains).add(match.group(2))
        depth += line.count("{") - line.count("}")
    return TableListing(handle, comment, frozenset(sets), frozenset(chains))


def ownership_problem(listing: TableListing, table_name: str, owner: str) -> str | None:
    """Why an agent of cluster ``owner`` must not replace the listed table, or None when it may
    (it carries our mark for this cluster, or it is an unmarked table of an agent from before the
    mark: exactly our sets and chains)."""
    comment = listing.comment
    ours = owner_comment(owner)
    if comment is not None and comment.startswith(OWNER_MARK):
        if comment in (ours, OWNER_MARK):
            return None
        return (
            f"table ip {table_name} belongs to another node agent ({comment!r}); give this "
            "agent another nft_table"
        )
    if comment is None and listing.sets == _OUR_SETS and listing.chains == _OUR_CHAINS:
        return None
    what = f"comment {comment!r}" if comment is not None else "no dnslb comment"
    return (
        f"table ip {table_name} exists and was not created by a dnslb node agent ({what}); "
        f"the agent replaces its table whole, so it refuses to take this one: give it another "
        f"nft_table, or delete the table (nft delete table ip {table_name}) if it is a leftover"
    )


def render_base(
    vip: str, table_name: str, *, owner: str = "", replace_handle: int | None = None
) -> str:
    """The base ruleset, fenced, as one transaction: it creates the table (marked as ours for
    cluster ``owner``), after deleting the table with handle ``replace_handle`` (the previous
    copy, already checked to be ours) when one is given. It fails whole when the table exists
    and ``replace_handle`` is None, or when that handle is gone."""
    vip = check_vip(vip)
    table = check_table_name(table_name)
    delete = f"delete table ip handle {replace_handle}\n" if replace_handle is not None else ""
    return f"""\
{delete}create table ip {table} {{ comment "{owner_comment(owner)}"; }}
table ip {table} {{
    set active {{
        type mark
    }}
    set lease {{
        type ipv4_addr
        flags timeout
    }}
    chain prerouting {{
        type filter hook prerouting priority raw; policy accept;
        ip daddr {vip} meta pkttype {{ broadcast, multicast }} meta pkttype set host
    }}
    chain input {{
        type filter hook input priority filter; policy accept;
        ip daddr {vip} jump vip
    }}
    chain vip {{
        ct state established,related accept
        jump classify
        drop
    }}
    chain classify {{
    }}
}}
"""


def render_classify_rule(
    bucket_count: int, seed: int, *, require_listener: bool, leased: bool = False
) -> str:
    """The rule that accepts a pure SYN whose bucket is in the ``active`` set (and, ``leased``,
    only while the VIP's element in the ``lease`` set has not timed out)."""
    if not 1 <= bucket_count <= MAX_BUCKETS:
        raise ValueError(f"bucket_count must be 1..{MAX_BUCKETS}, not {bucket_count}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be 0..2^32-1, not {seed}")
    listener = " socket transparent 0" if require_listener else ""
    lease = "ip daddr @lease " if leased else ""
    return (
        f"{lease}tcp flags & (fin|syn|rst|ack) == syn"
        f" meta mark set jhash ip saddr . tcp sport mod {bucket_count} seed {seed:#x}"
        f" meta mark @active{listener} accept"
    )


def render_apply(
    table_name: str,
    buckets: Sequence[int],
    bucket_count: int,
    seed: int,
    *,
    require_listener: bool,
    leased: bool = False,
) -> str:
    """One transaction: the classify rule and the ``active`` set replaced together. ``leased``,
    the rule accepts only while the lease runs; applying a table does not renew it (only a
    renewal before a heartbeat does: see :class:`agents.node_agent.LeaseKeeper`)."""
    table = check_table_name(table_name)
    rule = render_classify_rule(
        bucket_count, seed, require_listener=require_listener, leased=leased
    )
    lines = [
        f"flush chain ip {table} classify",
        f"add rule ip {table} classify {rule}",
        f"flush set ip {table} active",
    ]
    ordered = sorted(set(buckets))
    if ordered and not (ordered[0] >= 0 and ordered[-1] < bucket_count):
        raise ValueError(f"buckets must be 0..{bucket_count - 1}")
    for start in range(0, len(ordered), _ELEMENTS_PER_LINE):
        chunk = ", ".join(str(bucket) for bucket in ordered[start : start + _ELEMENTS_PER_LINE])
        lines.append(f"add element ip {table} active {{ {chunk} }}")
    return "\n".join(lines) + "\n"


def render_renew(table_name: str, vip: str, lease: float) -> str:
    """One transaction that restarts the lease: the VIP's element, timing out in ``lease`` s
    (rounded down to the millisecond, so a lease never ends later than asked)."""
    table = check_table_name(table_name)
    milliseconds = max(1, int(lease * 1000))
    return (
        f"flush set ip {table} lease\n"
        f"add element ip {table} lease {{ {check_vip(vip)} timeout {milliseconds}ms }}\n"
    )


def render_fence(table_name: str) -> str:
    """One transaction that empties the ``active`` set: no new connection is accepted."""
    return f"flush set ip {check_table_name(table_name)} active\n"
