"""Plan stores read hostile things without hanging or blowing memory: a FIFO or /dev/zero at the
plan's path, oversized plans, hostile statistics documents (files and Redis hashes), and a
Redis that answers the store badly or not at all (the fake server of dnslb.fuzz_resp)."""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemons.pdns import PdnsSettings, pipe_command, render_config
from dnslb.errors import ConfigError, PlanError
from dnslb.fuzz_resp import Behaviour, HostileRedis, bulk, whole
from dnslb.plan import parse_plan, plan_to_json
from dnslb.plan_store import (
    MAX_STATS_BYTES,
    FilePlanStore,
    RedisPlanStore,
    last_good_store,
    open_store,
)
from dnslb.resp import (
    RedisAddress,
    RedisConnection,
    RedisProtocolError,
    RedisTimeoutError,
)
from tests.conftest import plan_doc

TAG = "T00000000abcd"


@pytest.fixture
def plan_path(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    FilePlanStore(path).publish(parse_plan(plan_doc(version=3)))
    return path


# -- the file store: what is at the path ---------------------------------------------------------


@pytest.mark.timeout(20)
def test_a_fifo_at_the_plan_path_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    os.mkfifo(path)
    # Should the read block on the FIFO, a writer comes after 5 s and the read ends (with an
    # empty plan, a PlanError): the test fails instead of hanging.
    release = threading.Timer(5.0, lambda: os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK)))
    release.start()
    try:
        with pytest.raises(OSError, match="not a regular file \\(a FIFO\\)") as caught:
            FilePlanStore(path).read()
    finally:
        release.cancel()
    assert caught.value.errno == errno.EINVAL
    assert FilePlanStore(path).stamp() is not None  # polled as usual; only the read refuses


def test_a_symlink_to_dev_zero_is_refused_not_read(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.symlink_to("/dev/zero")
    with pytest.raises(OSError, match="a character device") as caught:
        FilePlanStore(path).read()
    assert caught.value.errno == errno.EINVAL


def test_a_directory_at_the_plan_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.mkdir()
    with pytest.raises(OSError, match="a directory"):
        FilePlanStore(path).read()


def test_a_symlink_to_a_regular_file_is_read(plan_path: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(plan_path)
    assert FilePlanStore(link).read().version == 3


def test_a_plan_larger_than_the_limit_is_refused(plan_path: Path) -> None:
    size = plan_path.stat().st_size
    assert FilePlanStore(plan_path, max_plan_bytes=size).read().version == 3
    with pytest.raises(OSError, match=f"larger than {size - 1} bytes") as caught:
        FilePlanStore(plan_path, max_plan_bytes=size - 1).read()
    assert caught.value.errno == errno.EFBIG


def test_a_huge_sparse_file_is_refused_from_its_size_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    with open(path, "wb") as handle:
        handle.truncate(8 * 1024**3)  # 8 GiB of holes
    with pytest.raises(OSError, match="larger than"):
        FilePlanStore(path).read()


def test_a_plan_that_is_not_a_plan_is_still_a_plan_error(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(b"[" * 100_000)
    with pytest.raises(PlanError):
        FilePlanStore(path).read()


# -- the file store: writing ---------------------------------------------------------------------


def test_the_plan_and_its_last_good_copy_are_written_0644_whatever_the_umask(
    tmp_path: Path,
) -> None:
    store = FilePlanStore(tmp_path / "plan.json")
    (tmp_path / "state").mkdir()
    previous = os.umask(0o077)
    try:
        store.publish(parse_plan(plan_doc()))
        kept = last_good_store(store, tmp_path / "state")
        kept.publish(parse_plan(plan_doc()), durable=False)
        store.open_stats()
        store.write_stats("host-1", {"written_at": time.time()})
    finally:
        os.umask(previous)
    assert (tmp_path / "plan.json").stat().st_mode & 0o777 == 0o644
    assert kept.path.parent == tmp_path / "state"
    assert kept.path.stat().st_mode & 0o777 == 0o644
    assert (store.stats_dir / "host-1.json").stat().st_mode & 0o777 == 0o644


def test_the_last_good_copy_is_named_after_the_plan_it_keeps(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = last_good_store(FilePlanStore(tmp_path / "a" / "plan.json"), state)
    again = last_good_store(FilePlanStore(tmp_path / "a" / ".." / "a" / "plan.json"), state)
    other = last_good_store(FilePlanStore(tmp_path / "b" / "plan.json"), state)
    redis = last_good_store(open_store("redis://:pw@127.0.0.1:1/0?key=k"), state)
    assert first.path == again.path  # every pipe backend of one plan shares it
    assert len({first.path, other.path, redis.path}) == 3  # other plans never do
    assert all(kept.path.parent == state for kept in (first, other, redis))
    assert "pw" not in redis.path.name


def test_a_reader_leaves_nothing_beside_a_plan_no_manager_reads(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path / "plan.json")
    store.publish(parse_plan(plan_doc()))
    store.write_stats("host-1", good_stats())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["plan.json"]
    store.open_stats()  # what the manager does when it publishes
    store.write_stats("host-1", good_stats())
    assert [d["pools"] for d in store.read_stats()] == [good_stats()["pools"]]


def test_publishing_replaces_a_symlink_at_the_plan_path_and_never_writes_through_it(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    path = tmp_path / "plan.json"
    path.symlink_to(victim)
    FilePlanStore(path).publish(parse_plan(plan_doc(version=8)))
    assert victim.read_text() == "untouched"
    assert not path.is_symlink() and FilePlanStore(path).read().version == 8


def test_statistics_are_never_written_through_a_planted_symlink(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path / "plan.json")
    store.stats_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    for planted in (".host-1.json.tmp", "host-1.json"):  # the old fixed temporary name too
        (store.stats_dir / planted).symlink_to(victim)
    store.write_stats("host-1", {"written_at": time.time(), "pools": {}})
    assert victim.read_text() == "untouched"
    assert [d["pools"] for d in store.read_stats()] == [{}]


def test_a_plan_larger_than_readers_accept_is_not_published(plan_path: Path) -> None:
    big = plan_doc(version=4)
    big["pools"][0]["members"] = [
        {"id": f"m{i}", "address": f"10.0.{i // 250}.{i % 250 + 1}"} for i in range(2000)
    ]
    store = FilePlanStore(plan_path, max_plan_bytes=50_000)
    with pytest.raises(OSError, match="more than readers accept") as caught:
        store.publish(parse_plan(big))
    assert caught.value.errno == errno.EFBIG
    assert store.read().version == 3  # the old plan stays


# -- statistics documents ------------------------------------------------------------------------


def good_stats(**fields: Any) -> dict[str, Any]:
    return {"written_at": time.time(), "pools": {"www": {"a": [1, 2]}}, **fields}


def test_hostile_statistics_files_are_skipped_without_hanging(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path / "plan.json")
    store.open_stats()
    store.write_stats("good", good_stats())
    stats = store.stats_dir
    os.mkfifo(stats / "fifo.json")
    (stats / "zero.json").symlink_to("/dev/zero")
    (stats / "deep.json").write_text("[" * 100_000)
    (stats / "list.json").write_text('["x", 1]')
    (stats / "binary.json").write_bytes(b"\xff\xfe\x00")
    with open(stats / "huge.json", "wb") as handle:
        handle.truncate(MAX_STATS_BYTES + 1)
    (stats / "dir.json").mkdir()
    [document] = store.read_stats()
    assert document["pools"] == {"www": {"a": [1, 2]}}


def test_old_statistics_files_are_removed(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path / "plan.json")
    store.open_stats()
    store.write_stats("old", good_stats())
    old = store.stats_dir / "old.json"
    os.utime(old, (time.time() - 10_000, time.time() - 10_000))
    assert store.read_stats(max_age=3600) == []
    assert not old.exists()


# -- the Redis store against a hostile server ----------------------------------------------------


@pytest.fixture
def server() -> Iterator[HostileRedis]:
    fake = HostileRedis()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def store(server: HostileRedis) -> Iterator[RedisPlanStore]:
    address = RedisAddress(port=server.port, key=f"k{TAG}")
    connection = RedisConnection(address, 0.3, clock=lambda: 0.0, rng=random.Random(1))
    plans = RedisPlanStore(
        address, 0.3, bulk_timeout=1.5, max_plan_bytes=100_000, connection=connection
    )
    yield plans
    plans.close()


def test_a_stamp_that_never_comes_fails_at_the_short_deadline(
    server: HostileRedis, store: RedisPlanStore
) -> None:
    server.script("GET", TAG, Behaviour(()))
    with pytest.raises(RedisTimeoutError, match=r"within 0\.3 s"):
        store.stamp()
    server.settle()


def test_a_stamp_longer_than_a_small_reply_is_refused(
    server: HostileRedis, store: RedisPlanStore
) -> None:
    server.script("GET", TAG, whole(bulk(b"9" * 100_000)))
    with pytest.raises(RedisProtocolError):
        store.stamp()
    server.settle()


def test_the_plan_is_read_with_the_longer_deadline(
    server: HostileRedis, store: RedisPlanStore
) -> None:
    text = plan_to_json(parse_plan(plan_doc(version=5))).encode()
    half = len(text) // 2
    # The plan comes in two halves 0.4 s apart: later than a stamp may take, within a plan's.
    halves = (b"$%d\r\n" % len(text) + text[:half], text[half:] + b"\r\n")
    server.script("GET", TAG, Behaviour(halves, interval=0.4))
    assert store.read().version == 5
    server.settle()


def test_a_plan_claimed_larger_than_the_limit_fails_at_its_header(
    server: HostileRedis, store: RedisPlanStore
) -> None:
    server.script("GET", TAG, whole(b"$100065\r\n{"))
    with pytest.raises(RedisProtocolError, match="larger than"):
        store.read()
    server.settle()


def test_no_plan_in_redis_is_file_not_found(server: HostileRedis, store: RedisPlanStore) -> None:
    server.script("GET", TAG, whole(b"$-1\r\n"))
    with pytest.raises(FileNotFoundError):
        store.read()
    server.settle()


def stats_reply(*items: bytes) -> bytes:
    return b"*%d\r\n%s" % (len(items), b"".join(items))


def test_hostile_statistics_in_redis_are_skipped(
    server: HostileRedis, store: RedisPlanStore
) -> None:
    good = json.dumps(good_stats()).encode()
    reply = stats_reply(
        bulk(b"good"),
        bulk(good),
        bulk(b"deep"),
        bulk(b"[" * 50_000),
        bulk(b"list"),
        bulk(b'["x", 1]'),
        bulk(b"huge-time"),
        bulk(b'{"written_at": 1%s}' % (b"0" * 400)),
        bulk(b"nan-time"),
        bulk(b'{"written_at": NaN}'),
        bulk(b"no-time"),
        bulk(b'{"pools": {}}'),
        b":7\r\n",
        b"$-1\r\n",
        bulk(b"odd one out"),
    )
    server.script("HGETALL", TAG, whole(reply))
    assert store.read_stats() == [json.loads(good)]
    server.settle()


def test_statistics_survive_a_failed_removal_of_old_ones(
    server: HostileRedis, store: RedisPlanStore
) -> None:
    old = json.dumps(good_stats(written_at=time.time() - 100_000)).encode()
    good = json.dumps(good_stats()).encode()
    reply = stats_reply(bulk(b"old"), bulk(old), bulk(b"good"), bulk(good))
    server.script("HGETALL", TAG, whole(reply))
    server.script("HDEL", TAG, whole(b"$abc\r\n"))
    assert store.read_stats(max_age=3600) == [json.loads(good)]
    server.settle()


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Behaviour(()), id="never answered"),
        pytest.param(whole(b"*1\r\n" * 5000), id="nested 5000 deep"),
        pytest.param(whole(b"*2147483647\r\n"), id="claims 2**31 elements"),
        pytest.param(whole(b"-ERR nope\r\n"), id="error reply"),
        pytest.param(whole(b":12\r\n"), id="not an array"),
    ],
)
def test_statistics_are_empty_when_redis_answers_badly(
    server: HostileRedis, store: RedisPlanStore, reply: Behaviour
) -> None:
    server.script("HGETALL", TAG, reply)
    assert store.read_stats() == []
    server.settle()


def test_open_store_passes_the_plan_limit_on() -> None:
    assert FilePlanStore("/x").max_plan_bytes == 64 * 1024 * 1024
    assert open_store("/x", max_plan_bytes=10).max_plan_bytes == 10
    redis = open_store("redis://127.0.0.1:1/0", max_plan_bytes=10)
    assert isinstance(redis, RedisPlanStore) and redis.max_plan_bytes == 10
    kept = last_good_store(open_store("/x", max_plan_bytes=10), "/state")
    assert kept.max_plan_bytes == 10


def test_an_unsupported_location_is_reported_without_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        open_store("rediss://:s3cret@db/0")
    assert "s3cret" not in str(caught.value)


# -- the Redis password is never on pdns's pipe-command -----------------------------------------


def test_a_password_in_the_plan_url_is_refused_saying_how_to_pass_it() -> None:
    with pytest.raises(ConfigError) as caught:
        pipe_command("redis://:s3cret@10.0.0.5:6379/0?key=dnslb:plan")
    message = str(caught.value)
    assert "s3cret" not in message
    assert "--redis-password-file" in message and "DNSLB_REDIS_PASSWORD" in message


def test_the_password_file_is_passed_to_the_pipe_backend_by_path() -> None:
    settings = PdnsSettings(plan="redis://10.0.0.5:6379/0", redis_password_file="/etc/dnslb/pw")
    config = render_config(settings, "/run/pdns").splitlines()
    line = next(line for line in config if line.startswith("pipe-command="))
    assert line.endswith("--plan redis://10.0.0.5:6379/0 --redis-password-file /etc/dnslb/pw")


@pytest.mark.parametrize(
    ("plan", "password_file", "problem"),
    [
        ("redis://db/0", "relative/pw", "absolute path"),
        ("/srv/plan.json", "/etc/dnslb/pw", "for a redis:// plan only"),
        ("/srv/plan\nlaunch=bind", None, "control character"),
        ("/srv/my plan.json", None, "splits pipe-command on spaces"),
    ],
)
def test_a_pipe_command_pdns_would_misread_is_refused(
    plan: str, password_file: str | None, problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        pipe_command(plan, redis_password_file=password_file)


@pytest.mark.parametrize(
    ("state_dir", "problem"),
    [
        pytest.param("state", "absolute path", id="relative"),
        pytest.param("/var/lib/my state", "splits pipe-command on spaces", id="space"),
    ],
)
def test_a_state_directory_pdns_would_misread_is_refused(state_dir: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        pipe_command("/srv/plan.json", state_dir=state_dir)


def test_the_state_directory_is_passed_to_the_pipe_backend() -> None:
    settings = PdnsSettings(plan="/srv/plan.json", state_dir="/var/lib/dnslb-pipe-backend")
    config = render_config(settings, "/run/pdns").splitlines()
    line = next(line for line in config if line.startswith("pipe-command="))
    assert line.endswith("--plan /srv/plan.json --state-dir /var/lib/dnslb-pipe-backend")
