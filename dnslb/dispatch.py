"""Dispatch tables for single-IP clusters: which node accepts which share of new connections.

Every node of a cluster receives every packet sent to the cluster's address (the VIP). Each new
connection falls into one of a fixed number of **buckets** by a hash of the client's address and
port (nftables ``jhash ip saddr . tcp sport mod N seed S``, replicated in :mod:`dnslb.jhash`), and
the table says, per bucket, the **active** node (the one that accepts) and the **backup** node
(the one that takes the bucket over when the active node dies). Established connections never
consult the table: each node keeps accepting the packets of connections it already holds.

The maths here is pure and deterministic (same inputs, same table):

* :func:`quotas` turns weights into bucket counts by the largest-remainder method, so shares
  follow weights to within one bucket.
* :func:`build_table` builds a table, from scratch or from the previous one. From a previous
  table it moves the fewest buckets possible: only buckets of over-quota (or removed) nodes move,
  and only to under-quota nodes, so a weight change disturbs no more new-connection routing than
  it must.
* Backups are never the active node, and each node's buckets have their backups spread over the
  other nodes in proportion to those nodes' weights (the duplicate-processing router cluster's
  rule: after a failure, load goes to the members with spare capacity).
* :func:`failover` hands a dead node's buckets to their backups without moving any other bucket,
  then rebuilds the backups.

The JSON form (see :func:`table_to_dict`)::

    {"cluster": "vip-1", "version": 7, "seed": 3735928559,
     "buckets": [["node-a", "node-b"], ["node-b", "node-c"], ["node-c", null], ...]}

:func:`parse_table` validates a decoded document and raises :class:`~dnslb.errors.ProtocolError`
listing every problem.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dnslb.config import checked, setting
from dnslb.errors import ProtocolError
from dnslb.jhash import nft_bucket
from dnslb.plan import show
from dnslb.report import id_problem

MIN_BUCKETS = 1
MAX_BUCKETS = 65536
RECOMMENDED_BUCKET_COUNTS = (256, 1024, 4096)
DEFAULT_BUCKET_COUNT = 1024
MAX_ID_LENGTH = 128
MAX_SEED = 0xFFFFFFFF
MAX_VERSION = 2**63 - 1

Bucket = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class BucketTable:
    """One version of a cluster's dispatch table; :func:`build_table` and :func:`failover` make
    valid ones, :func:`parse_table` checks one that comes from outside.

    ``buckets[i]`` is ``(active, backup)`` for bucket ``i``; ``backup`` is None only when the
    table has a single node. Built in code otherwise, a table is checked with
    :func:`~dnslb.config.checked` (``config_problems`` states the invariants).
    """

    cluster: str = setting(help="the cluster's name")
    version: int = setting(help="increases with every table of the cluster", min=0, max=MAX_VERSION)
    seed: int = setting(help="the jhash seed", min=0, max=MAX_SEED)
    buckets: tuple[Bucket, ...] = setting(help="(active, backup) node ids, per bucket")

    def config_problems(self) -> list[str]:
        problems = [f"cluster: {problem}"] if (problem := id_problem(self.cluster)) else []
        return problems + _buckets_problems(self.buckets)

    @property
    def bucket_count(self) -> int:
        """The number of buckets (the ``mod`` of the hash)."""
        return len(self.buckets)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node the table names, as active or backup, sorted."""
        names = {active for active, _ in self.buckets}
        names.update(backup for _, backup in self.buckets if backup is not None)
        return tuple(sorted(names))

    def active_buckets(self, node: str) -> tuple[int, ...]:
        """The buckets ``node`` accepts new connections for, ascending."""
        return tuple(index for index, (active, _) in enumerate(self.buckets) if active == node)

    def shares(self) -> dict[str, int]:
        """Active bucket count per node (nodes that are only backups have 0)."""
        counts = dict.fromkeys(self.nodes, 0)
        counts.update(Counter(active for active, _ in self.buckets))
        return counts

    def bucket_of(self, saddr: str, sport: int) -> int:
        """The bucket nftables puts a connection from ``saddr:sport`` in."""
        return nft_bucket(saddr, sport, self.bucket_count, self.seed)

    def owner(self, saddr: str, sport: int) -> str:
        """The node that accepts a new connection from ``saddr:sport``."""
        return self.buckets[self.bucket_of(saddr, sport)][0]


def _table_problems(cluster: object, version: object, seed: object, buckets: object) -> list[str]:
    """Every problem of a table's parts as a peer sent them (any JSON value in each)."""
    problems: list[str] = []
    if problem := id_problem(cluster):
        problems.append(f"cluster: {problem}")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        problems.append(f"version: must be an integer from 0 to 2^63-1, not {show(version)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        problems.append(f"seed: must be an integer from 0 to 2^32-1, not {show(seed)}")
    return problems + _buckets_problems(buckets, room=20 - len(problems))


def _buckets_problems(buckets: object, room: int = 20) -> list[str]:
    """The problems of a table's buckets: at most ``room`` of them, then one saying there are
    more (a hostile table may have 65,536 bad buckets)."""
    problems: list[str] = []
    if not isinstance(buckets, Sequence) or isinstance(buckets, str | bytes):
        problems.append("buckets: must be a list of [active, backup] pairs")
        return problems
    if not MIN_BUCKETS <= len(buckets) <= MAX_BUCKETS:
        problems.append(f"buckets: must hold {MIN_BUCKETS} to {MAX_BUCKETS}, not {len(buckets)}")
        return problems  # a claimed million buckets is not worth walking through
    names: set[str] = set()
    checked: dict[object, str | None] = {}  # a table names a few nodes thousands of times

    def node_problem(value: object) -> str | None:
        if isinstance(value, str) and value in checked:
            return checked[value]
        problem = id_problem(value)
        if isinstance(value, str):
            checked[value] = problem
        return problem

    null_backup = False
    for index, pair in enumerate(buckets):
        if len(problems) >= room:
            problems.append("buckets: more problems not shown")
            break
        if not isinstance(pair, Sequence) or isinstance(pair, str | bytes) or len(pair) != 2:
            problems.append(f"buckets[{index}]: must be a pair [active, backup]")
            continue
        active, backup = pair
        if problem := node_problem(active):
            problems.append(f"buckets[{index}][0]: node id {problem}")
        else:
            names.add(active)
        if backup is None:
            null_backup = True
        elif problem := node_problem(backup):
            problems.append(f"buckets[{index}][1]: node id {problem} (or null)")
        elif backup == active:
            problems.append(f"buckets[{index}]: backup is the active node {show(active)}")
        else:
            names.add(backup)
    if null_backup and len(names) > 1:
        problems.append("buckets: backup may be null only when the table has a single node")
    return problems


def _is_node_id(value: object) -> bool:
    return id_problem(value) is None


# --- the maths ---------------------------------------------------------------------------------


def _check_weights(weights: Mapping[str, float]) -> dict[str, Fraction]:
    if not weights:
        raise ValueError("a dispatch table needs at least one node")
    exact: dict[str, Fraction] = {}
    for node, weight in weights.items():
        if not _is_node_id(node):
            raise ValueError(f"node id {node!r}: must be a string of 1 to 128 characters")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight of {node!r}: must be a finite number >= 0, not {weight!r}")
        exact[node] = Fraction(weight)
    if sum(exact.values()) == 0:
        # Nobody has spare capacity: sharing equally is the least surprising split.
        return dict.fromkeys(exact, Fraction(1))
    return exact


def quotas(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Split ``total`` buckets over nodes by weight, by the largest-remainder method.

    Each node gets ``floor(total * w / W)`` plus one for the nodes with the largest remainders
    (ties go to the smaller node id), so every count is within one of its exact share and the
    counts add up to ``total``. All-zero weights split equally. Raises ``ValueError`` for no
    nodes or a negative or non-finite weight.
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, not {total}")
    exact = _check_weights(weights)
    whole = sum(exact.values())
    ideal = {node: total * weight / whole for node, weight in exact.items()}
    counts = {node: math.floor(share) for node, share in ideal.items()}
    left = total - sum(counts.values())
    by_remainder = sorted(ideal, key=lambda node: (-(ideal[node] - counts[node]), node))
    for node in by_remainder[:left]:
        counts[node] += 1
    return counts


def _pick_most_deficient(target: Mapping[str, int], have: Counter[str]) -> str:
    # Largest (target - have) first, then the smallest node id, for a deterministic table.
    return min(target, key=lambda node: (have[node] - target[node], node))


def _interleave(target: Mapping[str, int], total: int) -> list[str]:
    """A sequence of ``total`` node ids holding each node exactly ``target[node]`` times,
    interleaved by smooth weighted round-robin so that no node holds a long run of buckets."""
    current = dict.fromkeys(target, 0)
    order: list[str] = []
    nodes = sorted(target)
    for _ in range(total):
        for node in nodes:
            current[node] += target[node]
        # max() keeps the first of equals, so ties go to the smaller node id.
        chosen = max(nodes, key=current.__getitem__)
        current[chosen] -= total
        order.append(chosen)
    return order


def _assign_actives(
    weights: Mapping[str, float], bucket_count: int, previous: Sequence[str] | None
) -> list[str]:
    target = quotas(weights, bucket_count)
    if previous is None:
        return _interleave(target, bucket_count)
    kept: Counter[str] = Counter()
    actives: list[str | None] = [None] * bucket_count
    for index, node in enumerate(previous):
        # A node keeps its buckets up to its new quota; its lowest-numbered buckets stay. The
        # hash spreads flows uniformly over buckets, so which ones move does not matter to
        # balance, only how many.
        if node in target and kept[node] < target[node]:
            actives[index] = node
            kept[node] += 1
    result: list[str] = []
    for held in actives:
        if held is not None:
            result.append(held)
            continue
        chosen = _pick_most_deficient(target, kept)
        kept[chosen] += 1
        result.append(chosen)
    return result


def _assign_backups(
    actives: Sequence[str],
    weights: Mapping[str, float],
    previous: Sequence[str | None] | None,
) -> list[str | None]:
    nodes = sorted(weights)
    if len(nodes) == 1:
        return [None] * len(actives)
    backups: list[str | None] = [None] * len(actives)
    by_node: dict[str, list[int]] = {node: [] for node in nodes}
    for index, node in enumerate(actives):
        by_node[node].append(index)
    for node, indices in by_node.items():
        if not indices:
            continue
        others = {other: weights[other] for other in nodes if other != node}
        target = quotas(others, len(indices))
        have: Counter[str] = Counter()
        open_indices: list[int] = []
        for index in indices:
            old = previous[index] if previous is not None else None
            if old is not None and old in target and have[old] < target[old]:
                backups[index] = old
                have[old] += 1
            else:
                open_indices.append(index)
        for index in open_indices:
            chosen = _pick_most_deficient(target, have)
            backups[index] = chosen
            have[chosen] += 1
    return backups


def build_table(
    cluster: str,
    weights: Mapping[str, float],
    *,
    version: int,
    seed: int,
    bucket_count: int = DEFAULT_BUCKET_COUNT,
    previous: BucketTable | None = None,
) -> BucketTable:
    """A table whose active shares are :func:`quotas` of ``weights``.

    With ``previous`` (same bucket count and seed), only the buckets that must move do: those of
    nodes no longer in ``weights`` and the excess of nodes now over their quota, each given to a
    node under its quota. Backups are rebuilt for the new actives, keeping previous backups that
    still fit. Without ``previous`` (or with a different bucket count or seed, where every
    bucket changes meaning anyway) the table is built from scratch.
    """
    if not MIN_BUCKETS <= bucket_count <= MAX_BUCKETS:
        raise ValueError(f"bucket_count must be {MIN_BUCKETS}..{MAX_BUCKETS}, not {bucket_count}")
    compatible = (
        previous is not None and previous.bucket_count == bucket_count and previous.seed == seed
    )
    old_actives = [a for a, _ in previous.buckets] if previous is not None and compatible else None
    old_backups = [b for _, b in previous.buckets] if previous is not None and compatible else None
    actives = _assign_actives(weights, bucket_count, old_actives)
    backups = _assign_backups(actives, weights, old_backups)
    table = BucketTable(cluster, version, seed, tuple(zip(actives, backups, strict=True)))
    return checked(table, "bucket table")


def failover(
    table: BucketTable, dead: Collection[str], weights: Mapping[str, float], *, version: int
) -> BucketTable:
    """The table after the nodes in ``dead`` stopped: their buckets go to their backups.

    ``weights`` are the surviving nodes' weights (dead nodes in it are ignored). Buckets of live
    nodes never move. A dead node's bucket goes to its backup when the backup is alive, else to
    the live node furthest under its quota. Backups are then rebuilt over the survivors. Raises
    ``ValueError`` when no node survives.
    """
    alive = {node: weight for node, weight in weights.items() if node not in dead}
    target = quotas(alive, table.bucket_count)
    have: Counter[str] = Counter(active for active, _ in table.buckets if active in alive)
    actives: list[str] = []
    for active, backup in table.buckets:
        if active in alive:
            actives.append(active)
            continue
        if backup is not None and backup in alive:
            chosen = backup
        else:
            chosen = _pick_most_deficient(target, have)
        have[chosen] += 1
        actives.append(chosen)
    old_backups = [backup for _, backup in table.buckets]
    backups = _assign_backups(actives, alive, old_backups)
    after = BucketTable(
        table.cluster, version, table.seed, tuple(zip(actives, backups, strict=True))
    )
    return checked(after, "bucket table")


def moved_buckets(old: BucketTable, new: BucketTable) -> list[int]:
    """Indices of buckets whose active node differs between ``old`` and ``new``."""
    if old.bucket_count != new.bucket_count or old.seed != new.seed:
        return list(range(new.bucket_count))
    return [
        index
        for index, ((was, _), (now, _)) in enumerate(zip(old.buckets, new.buckets, strict=True))
        if was != now
    ]


# --- JSON --------------------------------------------------------------------------------------

_FIELDS = ("cluster", "version", "seed", "buckets")


def table_to_dict(table: BucketTable) -> dict[str, Any]:
    """The JSON document of ``table``; :func:`parse_table` reads it back unchanged."""
    return {
        "cluster": table.cluster,
        "version": table.version,
        "seed": table.seed,
        "buckets": [[active, backup] for active, backup in table.buckets],
    }


def table_to_json(table: BucketTable) -> bytes:
    """``table`` as compact UTF-8 JSON."""
    return json.dumps(table_to_dict(table), separators=(",", ":")).encode()


def parse_table(document: object) -> BucketTable:
    """Validate a decoded table document; raises :class:`ProtocolError` with every problem."""
    if not isinstance(document, Mapping):
        raise ProtocolError("invalid dispatch table: must be a JSON object")
    problems = [f"{key}: unknown field" for key in document if key not in _FIELDS]
    problems += [f"{key}: missing" for key in _FIELDS if key not in document]
    if problems:
        raise ProtocolError("invalid dispatch table: " + "; ".join(problems))
    cluster, version = document["cluster"], document["version"]
    seed, buckets = document["seed"], document["buckets"]
    problems = _table_problems(cluster, version, seed, buckets)
    if problems:
        raise ProtocolError("invalid dispatch table: " + "; ".join(problems))
    pairs = tuple((active, backup) for active, backup in buckets)
    return BucketTable(cluster, version, seed, pairs)


def parse_table_json(data: bytes | str) -> BucketTable:
    """Decode and validate a JSON table; raises :class:`ProtocolError` for bad JSON too (deep
    nesting, integers too long to read, invalid UTF-8), never anything else."""
    try:
        document = json.loads(data)
    except RecursionError:
        raise ProtocolError("invalid dispatch table: not JSON: nested too deep") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of 5,000 digits
        raise ProtocolError(f"invalid dispatch table: not JSON: {str(exc)[:200]}") from None
    return parse_table(document)
