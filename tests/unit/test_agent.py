"""The agent loop against a real HTTP receiver: pace, seq, token, outages, refusals, broken sources.

The agent sleeps on a clock that only moves when it sleeps, so each test runs in a fraction of
a second and the delays it chose are exact; everything else (HTTP, sockets, the JSON source
reading the receiver) is real.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable

import pytest

from agents.agent import Agent, backoff_delay
from agents.manager_client import ManagerClient
from agents.sources import Reading, Source, create_source
from daemons.process import free_port
from dnslb.agent_config import AgentConfig, JsonSourceConfig, NginxSourceConfig, SourceConfig
from dnslb.clock import FakeClock
from dnslb.config import Secret
from dnslb.report import parse_report
from tests.http_servers import Receiver

TOKEN = "t0ken-that-must-never-be-logged"
GOOD_STATUS = b'{"in_progress": 3, "max_concurrency": 10, "served_total": 99}'


class RecordingClock(FakeClock):
    """A fake clock that the agent alone moves: each sleep jumps it to the wake-up time at
    once (and yields to the loop), and is remembered."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


def make_agent(
    receiver: Receiver,
    clock: RecordingClock,
    *,
    source: SourceConfig | None = None,
    interval: float = 1.0,
    backoff_cap: float = 10.0,
) -> Agent:
    config = AgentConfig(
        server_id="cache-1",
        manager_url=receiver.url,
        token=Secret(TOKEN, "env:AGENT_TOKEN"),
        source=source or JsonSourceConfig(url=f"{receiver.url}/status"),
        interval=interval,
        backoff_cap=backoff_cap,
    )
    client = ManagerClient(config.reports_url, config.token, timeout=2.0)
    return Agent(config, create_source(config.source), client, clock=clock, rng=random.Random(7))


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[asyncio.Task[None]]:
    """Run the agent for the block; a crash of the agent fails the test."""
    task = asyncio.create_task(agent.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: Callable[[], bool], task: asyncio.Task[None], timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert not task.done(), "the agent stopped"
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.002)


@pytest.fixture
def receiver():
    with Receiver() as running_receiver:
        running_receiver.get_answer = (200, GOOD_STATUS)
        yield running_receiver


def test_reports_every_interval_with_increasing_seq_and_the_token(receiver, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    clock = RecordingClock()
    agent = make_agent(receiver, clock, interval=0.5)

    async def scenario() -> None:
        async with running(agent) as task:
            await until(lambda: len(receiver.posts()) >= 5, task)

    asyncio.run(scenario())
    posts = receiver.posts()
    reports = [parse_report(post.json()) for post in posts]
    assert {post.path for post in posts} == {"/v1/reports"}
    assert {post.headers["Authorization"] for post in posts} == {f"Bearer {TOKEN}"}
    first = int(FakeClock().time() * 1000)
    assert [r.seq for r in reports] == list(range(first, first + len(reports)))
    assert all(r.server_id == "cache-1" for r in reports)
    assert (reports[0].in_progress, reports[0].max_concurrency) == (3, 10)
    assert reports[0].served_total == 99
    assert reports[0].error is None
    assert all(r.cpu is not None and 0 <= r.cpu <= 1 for r in reports)
    assert all(r.mem is not None and 0 < r.mem <= 1 for r in reports)
    # Fixed pace: the (fake) clock only moves when the agent sleeps, so each wait is exact.
    assert set(clock.sleeps[: len(reports) - 1]) == {0.5}
    assert [r.time for r in reports[:3]] == [FakeClock().time() + 0.5 * i for i in range(3)]
    # Requests to the source never carry the manager's token.
    gets = [r for r in receiver.requests if r.method == "GET"]
    assert gets and all("Authorization" not in r.headers for r in gets)
    assert TOKEN not in caplog.text


def test_manager_down_backs_off_keeps_no_backlog_and_recovers(receiver, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dnslb.agent")
    clock = RecordingClock()
    agent = make_agent(receiver, clock, interval=1.0, backoff_cap=8.0)
    before_outage: list[int] = []
    failed_sleeps: list[float] = []

    async def scenario() -> None:
        async with running(agent) as task:
            await until(lambda: len(receiver.posts()) >= 3, task)
            receiver.stop()
            before_outage.extend(parse_report(p.json()).seq for p in receiver.posts())
            seq_at_outage = agent.seq
            sleeps_at_outage = len(clock.sleeps)
            await until(lambda: agent.failures >= 10, task)
            failed_sleeps.extend(clock.sleeps[sleeps_at_outage:])
            attempts = agent.seq - seq_at_outage
            receiver.get_answer = (200, GOOD_STATUS)
            receiver.start()
            await until(lambda: agent.failures == 0 and len(receiver.posts()) >= 6, task)
            assert attempts >= 10

    asyncio.run(scenario())
    reports = [parse_report(p.json()) for p in receiver.posts()]
    seqs = [r.seq for r in reports]
    # Every report was sent once, fresh: the ones that failed were dropped, not queued, so the
    # first report after the outage is the current one and the rest follow at the normal pace.
    assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs)
    after = seqs[len(before_outage) :]
    assert after[0] > before_outage[-1] + 10
    assert after == list(range(after[0], after[0] + len(after)))
    assert reports[len(before_outage)].time > reports[len(before_outage) - 1].time + 10
    # Exponential backoff with jitter: each wait within its doubling ceiling, never above the
    # cap, never below the interval, and reaching the cap's range.
    for failures, delay in enumerate(failed_sleeps[:10], start=1):
        assert 1.0 <= delay <= min(8.0, 2.0**failures)
    assert max(failed_sleeps) > 4.0
    assert clock.sleeps[-1] == 1.0
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith("manager")
    ]
    assert 1 <= len(warnings) <= 2  # dropped keep-alive connection, then connection refused
    assert len(warnings) == len(set(warnings))
    assert any("unreachable" in w for w in warnings)
    assert any("took a report again" in r.getMessage() for r in caplog.records)


def test_refusals_are_logged_once_per_reason_and_retried_at_backoff_pace(receiver, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dnslb.agent")
    clock = RecordingClock()
    agent = make_agent(receiver, clock, interval=1.0, backoff_cap=4.0)
    refusal_sleeps: list[float] = []

    async def scenario() -> None:
        async with running(agent) as task:
            receiver.answer = (401, b'{"detail": "bad token for cache-1"}')
            await until(lambda: len(receiver.posts()) >= 8, task)
            refusal_sleeps.extend(clock.sleeps[1:7])
            receiver.answer = (409, b"stale seq\n")
            count = len(receiver.posts())
            await until(lambda: len(receiver.posts()) >= count + 5, task)
            receiver.answer = (200, b"{}")
            await until(lambda: agent.failures == 0, task)

    asyncio.run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2, errors
    assert "HTTP 401 Unauthorized: bad token for cache-1" in errors[0]
    assert "HTTP 409 Conflict: stale seq" in errors[1]
    assert all(delay >= 1.0 for delay in refusal_sleeps)
    assert max(refusal_sleeps) > 2.0
    assert any("took a report again" in r.getMessage() for r in caplog.records)
    assert TOKEN not in caplog.text


def test_a_broken_source_gives_reports_that_say_why(receiver, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dnslb.agent")
    clock = RecordingClock()
    receiver.get_answer = (200, b"<html>not a status</html>")
    agent = make_agent(receiver, clock)

    async def scenario() -> None:
        async with running(agent) as task:
            await until(lambda: len(receiver.posts()) >= 3, task)
            receiver.get_answer = (200, GOOD_STATUS)
            await until(lambda: parse_report(receiver.posts()[-1].json()).in_progress == 3, task)

    asyncio.run(scenario())
    reports = [parse_report(p.json()) for p in receiver.posts()]
    broken = reports[0]
    assert broken.in_progress is None
    assert broken.error is not None and "not JSON" in broken.error
    assert broken.cpu is not None
    assert reports[-1].error is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not JSON" in warnings[0]
    assert any("readable again" in r.getMessage() for r in caplog.records)


def test_an_nginx_that_is_not_there_gives_reports_that_say_so(receiver) -> None:
    closed = f"http://127.0.0.1:{free_port()}/nginx_status"
    agent = make_agent(
        receiver, RecordingClock(), source=NginxSourceConfig(url=closed, max_concurrency=100)
    )

    async def scenario() -> None:
        async with running(agent) as task:
            await until(lambda: len(receiver.posts()) >= 2, task)

    asyncio.run(scenario())
    report = parse_report(receiver.posts()[0].json())
    assert report.in_progress is None
    assert report.max_concurrency == 100
    assert report.error is not None and f"cannot connect to {closed}" in report.error


class ExplodingSource(Source):
    """A source with a bug: it raises something no source should."""

    name = "exploding"

    async def measure(self) -> Reading:
        raise ZeroDivisionError("division by zero")


def test_a_source_that_raises_does_not_stop_the_agent(receiver, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dnslb.agent")
    clock = RecordingClock()
    config = AgentConfig(
        server_id="cache-1",
        manager_url=receiver.url,
        token=Secret(TOKEN, "env:AGENT_TOKEN"),
        source=JsonSourceConfig(url=f"{receiver.url}/status"),
    )
    client = ManagerClient(config.reports_url, config.token, timeout=2.0)
    agent = Agent(config, ExplodingSource(max_concurrency=7), client, clock=clock)

    async def scenario() -> None:
        async with running(agent) as task:
            await until(lambda: len(receiver.posts()) >= 4, task)

    asyncio.run(scenario())
    reports = [parse_report(p.json()) for p in receiver.posts()]
    assert all(r.in_progress is None for r in reports)
    assert reports[0].error == "source failed: ZeroDivisionError: division by zero"
    assert reports[0].max_concurrency == 7
    assert sum(1 for r in caplog.records if r.levelno == logging.ERROR) == 1


@pytest.mark.parametrize(
    ("interval", "cap"), [(1.0, 10.0), (0.05, 10.0), (1.0, 1.0), (2.0, 3.0)], ids=str
)
def test_backoff_delay_stays_within_its_doubling_ceiling(interval: float, cap: float) -> None:
    rng = random.Random(3)
    for failures in range(1, 40):
        ceiling = min(cap, interval * 2**failures)
        delay = backoff_delay(failures, interval, cap, rng)
        assert max(interval, ceiling / 2) <= delay <= max(interval, ceiling)


def test_backoff_delay_is_jittered() -> None:
    rng = random.Random(5)
    delays = {backoff_delay(10, 1.0, 10.0, rng) for _ in range(20)}
    assert len(delays) == 20
