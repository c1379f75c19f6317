"""The debug TXT answer: ``dig TXT _dnslb-explain.www.example.test`` says what this pipe backend
serves for ``www.example.test``.

Off by default (``--explain``): whoever can query the DNS server could otherwise read the pool's
members, weights and load. When on, each pool gets a TXT record set at
``_dnslb-explain.<pool name>``, computed with the pool's answers when the plan is compiled, so a
query costs what any other does (one dictionary lookup: nothing of the query is parsed) and the
plan's loader does the work once per plan. The record set is bounded: a header and at most
:data:`MAX_MEMBERS` members, ids cut to :data:`MAX_ID` characters, every string printable ASCII
well under DNS's 255 bytes (about 2 KB in all: clients retry over TCP beyond 512 bytes). It has
TTL 0 and (ABI 3 and later) scope bits, so no cache keeps it.

The strings, one per TXT record::

    dnslb plan v42 generated 1763780000 stale no; k 4 ttl_floor 5 fallback fail_open; 3 members
    cache-1 192.0.2.10 active w=70 ttl=60 u=0.30 first=50% in=100%
    cache-3 192.0.2.12 paused w=0 ttl=5 u=0.97 first=0% in=0%
"""

from __future__ import annotations

from dnslb.dnsname import MAX_NAME_LENGTH
from dnslb.plan import Plan, Pool
from dnslb.selection import PoolAnswers, answer_shares

LABEL = "_dnslb-explain"
MAX_MEMBERS = 16
MAX_ID = 32
MAX_STRING = 255  # bytes of a DNS character-string


def explain_name(pool_name: str) -> str | None:
    """Where the TXT explanation of a pool lives; None when the name would be too long."""
    name = f"{LABEL}.{pool_name}"
    return name if len(name) <= MAX_NAME_LENGTH else None


def header(plan: Plan, pool: Pool, *, stale: bool) -> str:
    """The first string: the plan and the pool's settings."""
    generated = f"{plan.generated_at:.0f}" if plan.generated_at is not None else "-"
    return (
        f"dnslb plan v{plan.version} generated {generated} stale {'yes' if stale else 'no'}; "
        f"k {pool.k} ttl_floor {pool.ttl_floor} fallback {pool.fallback.value}; "
        f"{len(pool.members)} members"
    )


def member_lines(pool: Pool, answers: PoolAnswers) -> tuple[str, ...]:
    """One string per member (sorted by id, at most :data:`MAX_MEMBERS`, then how many more)."""
    shares = answer_shares(answers)
    members = sorted(pool.members, key=lambda member: member.id)
    lines = []
    for member in members[:MAX_MEMBERS]:
        first, seen = shares.get(member.id, (0.0, 0.0))
        member_id = member.id if len(member.id) <= MAX_ID else member.id[: MAX_ID - 3] + "..."
        lines.append(
            f"{member_id} {member.address} {member.state.value} w={member.weight:g} "
            f"ttl={member.ttl} u={member.utilization:.2f} first={first:.0%} in={seen:.0%}"
        )
    if len(members) > MAX_MEMBERS:
        lines.append(f"... and {len(members) - MAX_MEMBERS} more members")
    return tuple(lines)


def txt_content(text: str) -> str:
    """``text`` as one TXT character-string in zone-file form: quoted, with ``"`` and ``\\``
    escaped and every byte outside printable ASCII written ``\\DDD``; cut to
    :data:`MAX_STRING` bytes."""
    out = []
    for byte in text.encode("utf-8", "replace")[:MAX_STRING]:
        if byte in (0x22, 0x5C):
            out.append("\\" + chr(byte))
        elif 0x20 <= byte <= 0x7E:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03d}")
    return '"' + "".join(out) + '"'
