"""The Redis plan store against a real redis-server: publish, poll, outages, and PowerDNS reading
the plan from Redis through the pipe backend."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dns.message
import dns.query
import pytest

from daemons.pdns import PdnsServer, PdnsSettings, render_config
from daemons.process import free_port, spawn, stop_group
from dnslb.errors import ConfigError
from dnslb.plan import parse_plan
from dnslb.plan_store import FilePlanStore, RedisPlanStore, open_store
from dnslb.resp import (
    RedisAddress,
    RedisBackoffError,
    RedisConnection,
    RedisError,
    RedisProtocolError,
    RedisTimeoutError,
    redis_answers,
)
from pipe_backend.backend import PipeBackend
from tests.conftest import plan_doc

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("redis-server") is None, reason="redis-server is not installed"
    ),
]

PASSWORD = "redis-test-password"


@dataclass
class Redis:
    port: int
    workdir: Path
    password: str | None
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.workdir)]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = spawn(
            args,
            name="redis-server",
            ready=lambda _: redis_answers(RedisAddress(port=self.port, password=self.password)),
            timeout=10,
        )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_group(process)

    def url(self, key: str = "dnslb:plan") -> str:
        return f"redis://127.0.0.1:{self.port}/0?key={key}"


OPENED: list[RedisPlanStore] = []


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    server = Redis(free_port(), tmp_path, PASSWORD)
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def close_stores() -> Iterator[None]:
    yield
    while OPENED:
        OPENED.pop().close()


def store(redis: Redis) -> RedisPlanStore:
    found = open_store(redis.url(), password=redis.password)
    assert isinstance(found, RedisPlanStore)
    OPENED.append(found)
    return found


def test_publish_stamp_and_read_round_trip(redis: Redis) -> None:
    plans = store(redis)
    assert plans.stamp() is None
    with pytest.raises(FileNotFoundError):
        plans.read()
    plan = parse_plan(plan_doc(generated_at=1000.0))
    plans.publish(plan)
    first = plans.stamp()
    assert plans.read() == plan
    plans.publish(parse_plan(plan_doc(generated_at=1001.0)))  # a refresh: same version
    assert plans.stamp() != first
    assert "password" not in plans.describe() and PASSWORD not in plans.describe()


def test_wrong_password_and_bad_urls_are_clear_errors(redis: Redis) -> None:
    wrong = open_store(redis.url(), password="nope")
    with pytest.raises(RedisError, match=r"WRONGPASS|invalid password"):
        wrong.stamp()
    wrong.close()
    with pytest.raises(ConfigError, match="database number"):
        open_store(f"redis://127.0.0.1:{redis.port}/zero")


def test_answer_counts_go_through_redis(redis: Redis) -> None:
    plans = store(redis)
    plans.write_stats("host-1", {"written_at": time.time(), "pools": {"www": {"a": [3, 5]}}})
    plans.write_stats("host-2", {"written_at": time.time() - 10_000, "pools": {}})
    assert [d["pools"] for d in plans.read_stats(max_age=3600)] == [{"www": {"a": [3, 5]}}]
    assert len(plans.read_stats(max_age=1e9)) == 1  # the stale one was removed


def test_the_pipe_backend_follows_redis_and_survives_its_outage(
    redis: Redis, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plans = store(redis)
    plans.publish(parse_plan(plan_doc(version=1)))
    last_good = FilePlanStore(tmp_path / "last-good.json")
    reader = store(redis)
    backend = PipeBackend(reader, last_good=last_good, rng=random.Random(1), poll_interval=0)
    backend.poll(force=True)
    assert backend.handle(b"HELO\t5").startswith(b"OK")
    query = b"Q\tv6.example.test\tIN\tAAAA\t-1\t1.2.3.4\t1.2.3.4\t1.2.3.4/32"
    assert backend.handle(query).count(b"\tAAAA\t") == 2

    doc = plan_doc(version=2)
    doc["pools"][1]["members"] = [{"id": "only", "address": "2001:db8::99"}]
    plans.publish(parse_plan(doc))
    backend.poll()
    assert b"2001:db8::99" in backend.handle(query)

    redis.stop()
    with caplog.at_level(logging.ERROR, logger="dnslb.pipe_backend"):
        for _ in range(5):
            backend.poll()
            assert b"2001:db8::99" in backend.handle(query)  # the last plan, still served
    assert caplog.text.count("unreachable") == 1
    # A coprocess PowerDNS starts during the outage serves the last good copy.
    late = PipeBackend(store(redis), last_good=last_good, poll_interval=0)
    late.poll(force=True)
    assert late.plan is not None and late.plan.version == 2

    redis.start()  # an empty Redis: the manager has not published again yet
    time.sleep(reader.connection.backoff_remaining())  # after the outage's failures
    backend.poll()
    assert b"2001:db8::99" in backend.handle(query)
    plans = store(redis)
    plans.publish(parse_plan(plan_doc(version=3)))
    time.sleep(reader.connection.backoff_remaining())
    backend.poll()
    assert backend.plan is not None and backend.plan.version == 3


def test_pdns_answers_from_a_plan_in_redis(tmp_path: Path) -> None:
    server = Redis(free_port(), tmp_path, None)
    server.start()
    pdns: PdnsServer | None = None
    try:
        plans = store(server)
        plans.publish(parse_plan(plan_doc()))
        port = free_port()
        pdns = PdnsServer(PdnsSettings(plan=server.url(), port=port), tmp_path / "pdns")
        pdns.start(probe_name="example.test")
        reply = dns.query.udp(
            dns.message.make_query("v6.example.test", "AAAA"), "127.0.0.1", port=port, timeout=3
        )
        assert sorted(str(r) for r in reply.answer[0]) == ["2001:db8::1", "2001:db8::2"]
        doc = plan_doc(version=8)
        doc["pools"][1]["members"] = [{"id": "new", "address": "2001:db8::8"}]
        plans.publish(parse_plan(doc))
        deadline = time.monotonic() + 3
        seen: list[str] = []
        while time.monotonic() < deadline:
            reply = dns.query.udp(
                dns.message.make_query("v6.example.test", "AAAA"), "127.0.0.1", port=port, timeout=3
            )
            seen = [str(r) for r in reply.answer[0]]
            if seen == ["2001:db8::8"]:
                break
            time.sleep(0.05)
        assert seen == ["2001:db8::8"]
    finally:
        if pdns is not None:
            pdns.stop()
        server.stop()


# -- hostile input at the store boundary (issue 14) ----------------------------------------------


def test_a_plan_of_100000_members_goes_through_redis_within_the_default_limits(
    redis: Redis,
) -> None:
    doc = plan_doc(version=9)
    doc["pools"][0]["members"] = [
        {"id": f"m{i}", "address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"}
        for i in range(100_000)
    ]
    plan = parse_plan(doc)
    plans = store(redis)
    plans.publish(plan)
    assert plans.read() == plan
    small = RedisPlanStore(
        RedisAddress(port=redis.port, password=redis.password), max_plan_bytes=1_000_000
    )
    OPENED.append(small)
    with pytest.raises(OSError, match="more than readers accept"):
        small.publish(plan)  # the writer checks with its readers' limit
    with pytest.raises(RedisProtocolError, match="larger than"):
        small.read()  # and a reader with a smaller one refuses it at the header


def test_a_redis_that_stops_answering_fails_each_read_at_its_deadline_then_recovers(
    redis: Redis,
) -> None:
    plans = store(redis)
    plans.publish(parse_plan(plan_doc(version=4)))
    stamp = plans.stamp()
    assert redis.process is not None
    os.kill(redis.process.pid, signal.SIGSTOP)  # accepts connections, answers nothing
    try:
        with pytest.raises(RedisTimeoutError):
            plans.stamp()
        with pytest.raises(RedisBackoffError):
            plans.read()  # backing off: raised at once
    finally:
        os.kill(redis.process.pid, signal.SIGCONT)
    time.sleep(plans.connection.backoff_remaining())
    assert plans.stamp() == stamp
    assert plans.read().version == 4


def test_a_connection_redis_closed_while_idle_is_reopened_without_an_error(redis: Redis) -> None:
    plans = store(redis)
    plans.publish(parse_plan(plan_doc(version=4)))
    admin = RedisConnection(RedisAddress(port=redis.port, password=redis.password))
    try:
        admin.command("CONFIG", "SET", "timeout", "1")  # Redis drops clients idle for 1 s
    finally:
        admin.close()
    plans.stamp()
    time.sleep(2.5)
    assert plans.stamp() is not None  # no error, no back-off: a fresh connection
    assert plans.connection.backoff_remaining() == 0


def test_pdns_reads_a_password_protected_redis_and_no_command_line_shows_the_password(
    redis: Redis, tmp_path: Path
) -> None:
    plans = store(redis)
    plans.publish(parse_plan(plan_doc()))
    with pytest.raises(ConfigError, match="--redis-password-file"):
        render_config(PdnsSettings(plan=f"redis://:{PASSWORD}@127.0.0.1:{redis.port}/0"), tmp_path)
    password_file = tmp_path / "redis-password"
    password_file.write_text(PASSWORD + "\n")
    password_file.chmod(0o600)
    port = free_port()
    settings = PdnsSettings(plan=redis.url(), port=port, redis_password_file=str(password_file))
    pdns = PdnsServer(settings, tmp_path / "pdns")
    try:
        pdns.start(probe_name="example.test")
        reply = dns.query.udp(
            dns.message.make_query("v6.example.test", "AAAA"), "127.0.0.1", port=port, timeout=3
        )
        assert sorted(str(r) for r in reply.answer[0]) == ["2001:db8::1", "2001:db8::2"]
        assert PASSWORD not in (tmp_path / "pdns" / "pdns.conf").read_text()
        assert pdns.process is not None
        lines = _command_lines(pdns.process.pid)
        assert any("pipe-backend" in line for line in lines)  # the coprocesses are running
        assert not any(PASSWORD in line for line in lines)
    finally:
        pdns.stop()


def _command_lines(group: int) -> list[str]:
    """The command lines of every process in process group ``group`` (what ps shows)."""
    lines = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != group:
                continue
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        lines.append(raw.replace(b"\0", b" ").decode(errors="replace"))
    return lines
