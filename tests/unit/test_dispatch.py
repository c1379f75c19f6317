"""Dispatch tables: shares follow weights, fewest moves, backups, failover, JSON."""

from __future__ import annotations

import json
import math
from collections import Counter
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnslb.config import checked, problems_of
from dnslb.dispatch import (
    BucketTable,
    build_table,
    failover,
    moved_buckets,
    parse_table,
    parse_table_json,
    quotas,
    table_to_dict,
    table_to_json,
)
from dnslb.errors import ConfigError, ProtocolError
from dnslb.jhash import nft_bucket

NODE_IDS = [f"node-{index}" for index in range(8)]

weights_strategy = st.dictionaries(
    st.sampled_from(NODE_IDS),
    st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=1000.0), st.integers(1, 50)),
    min_size=1,
    max_size=8,
).map(lambda weights: {node: float(weight) for node, weight in weights.items()})
bucket_counts = st.sampled_from([1, 2, 3, 7, 16, 64, 256, 1024])


def exact_shares(weights: dict[str, float], total: int) -> dict[str, Fraction]:
    exact = {node: Fraction(weight) for node, weight in weights.items()}
    whole = sum(exact.values())
    if whole == 0:
        return {node: Fraction(total, len(weights)) for node in weights}
    return {node: total * weight / whole for node, weight in exact.items()}


def assert_table_invariants(table: BucketTable, weights: dict[str, float]) -> None:
    target = quotas(weights, table.bucket_count)
    assert {node: count for node, count in table.shares().items() if count} == {
        node: count for node, count in target.items() if count
    }
    assert set(table.nodes) <= set(weights)
    for active, backup in table.buckets:
        assert active != backup
        assert (backup is None) == (len(weights) == 1)
    if len(weights) > 1:
        for node in weights:
            mine = table.active_buckets(node)
            others = {other: weight for other, weight in weights.items() if other != node}
            spread = Counter(table.buckets[index][1] for index in mine)
            expected = {other: count for other, count in quotas(others, len(mine)).items() if count}
            assert dict(spread) == expected, node


# --- quotas ------------------------------------------------------------------------------------


@given(weights_strategy, st.integers(0, 5000))
def test_quotas_add_up_and_stay_within_one_of_the_exact_share(weights, total):
    counts = quotas(weights, total)
    assert sum(counts.values()) == total
    for node, share in exact_shares(weights, total).items():
        assert math.floor(share) <= counts[node] <= math.ceil(share)


@pytest.mark.parametrize(
    ("weights", "total", "expected"),
    [
        pytest.param(
            {"a": 1, "b": 1, "c": 1}, 10, {"a": 4, "b": 3, "c": 3}, id="tie to smaller id"
        ),
        pytest.param({"a": 3, "b": 1}, 8, {"a": 6, "b": 2}, id="exact"),
        pytest.param({"a": 0, "b": 0}, 5, {"a": 3, "b": 2}, id="all zero split equally"),
        pytest.param({"a": 0, "b": 2}, 5, {"a": 0, "b": 5}, id="zero weight gets nothing"),
        pytest.param(
            {"a": 0.7, "b": 0.2, "c": 0.1}, 256, {"a": 179, "b": 51, "c": 26}, id="floats"
        ),
    ],
)
def test_quotas_cases(weights, total, expected):
    assert quotas(weights, total) == expected


@pytest.mark.parametrize(
    "weights",
    [
        pytest.param({}, id="no nodes"),
        pytest.param({"a": -1.0}, id="negative"),
        pytest.param({"a": math.nan}, id="nan"),
        pytest.param({"a": math.inf}, id="infinite"),
        pytest.param({"": 1.0}, id="empty id"),
    ],
)
def test_bad_weights_raise(weights):
    with pytest.raises(ValueError):  # noqa: PT011
        quotas(weights, 10)


# --- building ----------------------------------------------------------------------------------


@settings(max_examples=200)
@given(weights_strategy, bucket_counts, st.integers(0, 2**32 - 1))
def test_fresh_table_follows_weights_with_valid_spread_backups(weights, bucket_count, seed):
    table = build_table("vip", weights, version=1, seed=seed, bucket_count=bucket_count)
    assert table.bucket_count == bucket_count
    assert table.seed == seed
    assert_table_invariants(table, weights)


@given(weights_strategy, bucket_counts)
def test_building_is_deterministic(weights, bucket_count):
    first = build_table("vip", weights, version=1, seed=9, bucket_count=bucket_count)
    again = build_table(
        "vip", dict(reversed(weights.items())), version=1, seed=9, bucket_count=bucket_count
    )
    assert first == again


@settings(max_examples=300)
@given(weights_strategy, weights_strategy, bucket_counts)
def test_rebuild_moves_only_over_quota_buckets_to_under_quota_nodes(before, after, bucket_count):
    old = build_table("vip", before, version=1, seed=3, bucket_count=bucket_count)
    new = build_table("vip", after, version=2, seed=3, bucket_count=bucket_count, previous=old)
    assert_table_invariants(new, after)
    old_shares = old.shares()
    target = quotas(after, bucket_count)
    moved = moved_buckets(old, new)
    minimum = sum(
        count if node not in target else max(0, count - target[node])
        for node, count in old_shares.items()
    )
    assert len(moved) == minimum
    for index in moved:
        was, now = old.buckets[index][0], new.buckets[index][0]
        assert was not in target or old_shares[was] > target[was]
        assert old_shares.get(now, 0) < target[now]


@given(weights_strategy, bucket_counts)
def test_rebuild_with_the_same_weights_moves_nothing(weights, bucket_count):
    old = build_table("vip", weights, version=1, seed=3, bucket_count=bucket_count)
    new = build_table("vip", weights, version=2, seed=3, bucket_count=bucket_count, previous=old)
    assert new.buckets == old.buckets
    assert new.version == 2


def test_a_new_seed_or_bucket_count_builds_from_scratch():
    old = build_table("vip", {"a": 1, "b": 1}, version=1, seed=1, bucket_count=16)
    reseeded = build_table(
        "vip", {"a": 1, "b": 1}, version=2, seed=2, bucket_count=16, previous=old
    )
    assert moved_buckets(old, reseeded) == list(range(16))
    assert reseeded == build_table("vip", {"a": 1, "b": 1}, version=2, seed=2, bucket_count=16)


def test_fresh_table_interleaves_nodes():
    table = build_table("vip", {"a": 1, "b": 1, "c": 2}, version=1, seed=0, bucket_count=8)
    assert [active for active, _ in table.buckets] == ["c", "a", "b", "c", "c", "a", "b", "c"]


@pytest.mark.parametrize("bucket_count", [0, 65537])
def test_bucket_count_out_of_range_raises(bucket_count):
    with pytest.raises(ValueError, match="bucket_count"):
        build_table("vip", {"a": 1}, version=1, seed=0, bucket_count=bucket_count)


# --- failover ----------------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    weights_strategy.filter(lambda weights: len(weights) >= 2),
    bucket_counts,
    st.data(),
)
def test_failover_moves_only_dead_buckets_to_their_backups(weights, bucket_count, data):
    table = build_table("vip", weights, version=4, seed=3, bucket_count=bucket_count)
    nodes = sorted(weights)
    dead = set(data.draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=len(nodes) - 1)))
    alive = {node: weight for node, weight in weights.items() if node not in dead}
    after = failover(table, dead, alive, version=5)
    assert after.version == 5
    assert not set(after.nodes) & dead
    for (active, backup), (now, new_backup) in zip(table.buckets, after.buckets, strict=True):
        if active not in dead:
            assert now == active
        elif backup not in dead and backup is not None:
            assert now == backup
        assert now != new_backup
        assert (new_backup is None) == (len(alive) == 1)
    if len(alive) > 1:
        for node in alive:
            mine = after.active_buckets(node)
            others = {other: weight for other, weight in alive.items() if other != node}
            spread = Counter(after.buckets[index][1] for index in mine)
            expected = {other: count for other, count in quotas(others, len(mine)).items() if count}
            assert dict(spread) == expected


def test_failover_with_a_dead_backup_goes_to_the_least_loaded_survivor():
    table = BucketTable("vip", 1, 0, (("a", "b"), ("a", "b"), ("c", "a"), ("b", "a")))
    after = failover(table, {"a", "b"}, {"c": 1.0, "d": 1.0}, version=2)
    # Both survivors are 2 under their quota of 2 at first; c already holds bucket 2, so d is
    # furthest under and takes bucket 0, then the tie goes to the smaller id.
    assert [active for active, _ in after.buckets] == ["d", "c", "c", "d"]


def test_failover_of_every_node_raises():
    table = build_table("vip", {"a": 1, "b": 1}, version=1, seed=0, bucket_count=4)
    with pytest.raises(ValueError, match="at least one node"):
        failover(table, {"a", "b"}, {"a": 1, "b": 1}, version=2)


# --- owner -------------------------------------------------------------------------------------


@given(st.ip_addresses(v=4).map(str), st.integers(0, 65535), st.integers(0, 2**32 - 1))
def test_owner_is_the_active_node_of_the_kernels_bucket(saddr, sport, seed):
    table = build_table("vip", {"a": 1, "b": 2, "c": 3}, version=1, seed=seed, bucket_count=256)
    bucket = nft_bucket(saddr, sport, 256, seed)
    assert table.bucket_of(saddr, sport) == bucket
    assert table.owner(saddr, sport) == table.buckets[bucket][0]


# --- JSON --------------------------------------------------------------------------------------


@given(weights_strategy, bucket_counts, st.integers(0, 2**63 - 1), st.integers(0, 2**32 - 1))
def test_json_round_trip(weights, bucket_count, version, seed):
    table = build_table("vip-1", weights, version=version, seed=seed, bucket_count=bucket_count)
    assert parse_table_json(table_to_json(table)) == table
    assert parse_table(json.loads(json.dumps(table_to_dict(table)))) == table


def good_doc() -> dict[str, Any]:
    return {"cluster": "vip-1", "version": 3, "seed": 7, "buckets": [["a", "b"], ["b", "a"]]}


def with_changes(**changes: Any) -> dict[str, Any]:
    doc = good_doc()
    doc.update(changes)
    return doc


def without(key: str) -> dict[str, Any]:
    doc = good_doc()
    del doc[key]
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param([], "must be a JSON object", id="not an object"),
        pytest.param(with_changes(extra=1), "extra: unknown field", id="unknown field"),
        pytest.param(without("seed"), "seed: missing", id="missing seed"),
        pytest.param(with_changes(cluster=""), "cluster: must not be empty", id="empty cluster"),
        pytest.param(with_changes(cluster=5), "cluster: must be a string", id="integer cluster"),
        pytest.param(with_changes(cluster="v\tip"), "cluster: holds the control", id="tab"),
        pytest.param(
            with_changes(buckets=[["a\nDATA", "b"]]), "buckets[0][0]: node id holds", id="newline"
        ),
        pytest.param(
            with_changes(buckets=[["a", "\ud800"]]), "buckets[0][1]: node id holds", id="surrogate"
        ),
        pytest.param(
            with_changes(buckets=[["a", "b"]] * 70000), "must hold 1 to 65536", id="too many"
        ),
        pytest.param(with_changes(buckets=[[["a"], "b"]]), "buckets[0][0]", id="list as id"),
        pytest.param(with_changes(version=-1), "version: must be", id="negative version"),
        pytest.param(with_changes(version=True), "version: must be", id="boolean version"),
        pytest.param(with_changes(version=1.5), "version: must be", id="float version"),
        pytest.param(with_changes(seed=2**32), "seed: must be", id="seed too large"),
        pytest.param(with_changes(buckets={}), "buckets: must be a list", id="buckets object"),
        pytest.param(with_changes(buckets="ab"), "buckets: must be a list", id="buckets string"),
        pytest.param(with_changes(buckets=[]), "buckets: must hold 1", id="no buckets"),
        pytest.param(with_changes(buckets=[["a"]]), "buckets[0]: must be a pair", id="short pair"),
        pytest.param(with_changes(buckets=[[1, "b"]]), "buckets[0][0]: node id", id="int node"),
        pytest.param(with_changes(buckets=[["a", 2]]), "buckets[0][1]: node id", id="int backup"),
        pytest.param(with_changes(buckets=[["a", "a"]]), "backup is the active", id="same node"),
        pytest.param(
            with_changes(buckets=[["a", "b"], ["b", None]]),
            "null only when the table has a single node",
            id="null backup with two nodes",
        ),
        pytest.param(
            with_changes(buckets=[["a", None], ["b", None]]),
            "null only when the table has a single node",
            id="null backups with two actives",
        ),
    ],
)
def test_bad_documents_are_refused_with_a_clear_message(doc, message):
    with pytest.raises(ProtocolError, match="invalid dispatch table") as caught:
        parse_table(doc)
    assert message in str(caught.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ProtocolError) as caught:
        parse_table(with_changes(cluster=5, version=-2, seed=-1))
    text = str(caught.value)
    assert "cluster:" in text
    assert "version:" in text
    assert "seed:" in text


def test_too_many_problems_are_cut_short():
    with pytest.raises(ProtocolError, match="more problems not shown"):
        parse_table(with_changes(buckets=[["a", "a"]] * 100))


@pytest.mark.parametrize(
    "data",
    [b"{", b"\xff", b"", "[1,", b"[" * 100_000, b'{"version": ' + b"9" * 5000 + b"}"],
    ids=["truncated", "binary", "empty", "text", "nested 100,000 deep", "5,000 digits"],
)
def test_bad_json_is_a_protocol_error(data):
    with pytest.raises(ProtocolError, match="not JSON"):
        parse_table_json(data)


def test_single_node_table_has_no_backups():
    table = parse_table(with_changes(buckets=[["a", None], ["a", None]]))
    assert table.nodes == ("a",)
    assert table.shares() == {"a": 2}


def test_a_table_built_in_code_is_checked_by_the_settings_idiom():
    with pytest.raises(ConfigError, match="backup is the active node"):
        checked(BucketTable("vip", 1, 0, (("a", "a"),)))
    with pytest.raises(ConfigError) as caught:
        checked(BucketTable("vip\n1", -1, 2**32, (("a", None), ("b", "a"))))
    assert caught.value.problems == [
        "version: must be at least 0, not -1",
        "seed: must be at most 4294967295, not 4294967296",
        "cluster: holds the control or surrogate character '\\n'",
        "buckets: backup may be null only when the table has a single node",
    ]  # the fields' bounds, then the rules across fields
    assert problems_of(BucketTable("vip", 1, 0, (("a", "b"), ("b", "a")))) == []


def test_build_table_refuses_a_cluster_name_tables_cannot_carry():
    with pytest.raises(ConfigError, match="cluster"):
        build_table("vip\n1", {"a": 1.0}, version=1, seed=0)


def test_backup_only_nodes_have_a_zero_share():
    table = BucketTable("vip", 1, 0, (("a", "b"), ("a", "c")))
    assert table.shares() == {"a": 2, "b": 0, "c": 0}
    assert table.active_buckets("a") == (0, 1)
    assert table.active_buckets("b") == ()
