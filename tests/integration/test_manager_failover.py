"""Two managers in active/standby on one real PostgreSQL database, in one process on a fake
clock (the lease runs on real time: the database's clock): the standby serves reads and
redirects writes, takes over when the leader stops renewing during a scale-out, resumes the
launch cut short without launching it again, and the old leader's late writes are fenced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.main import attach_api
from dnslb.clock import FakeClock
from dnslb.model import ServerState
from manager.config import load_manager_config
from manager.leadership import Fenced
from manager.providers.memory import MemoryProvider
from manager.service import Manager
from tests.api_support import ADMIN, bearer, report_body, reporting_tokens, write_config
from tests.integration.postgres import PostgresCluster, postgres_cluster, reset_database

pytestmark = pytest.mark.integration

LEASE = "leadership: {lease: 1.0, renew: 0.2, margin: 0.3}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


def _config(directory: Path, port: int, cluster: PostgresCluster) -> Path:
    path = write_config(directory, port=port)
    text = path.read_text().replace("boot_time: 0, network", "boot_time: 30, network")
    path.write_text(text + f"state: {{url: '{cluster.url}', {LEASE}}}\n")
    return path


async def _close(*managers: Manager) -> None:
    for manager in managers:
        if manager.acting:
            await manager.close()
        else:  # a dead leader: only its connections
            if manager.leadership is not None:
                manager.leadership.close()
            manager.store.close()


def _memory(manager: Manager) -> MemoryProvider:
    provider = manager.lifecycles["auto"].provider
    assert isinstance(provider, MemoryProvider)
    return provider


async def _step(manager: Manager, clock: FakeClock, seq: int, load: int) -> None:
    """One second on the fake clock; the lease renewed as its loop would (it runs on real
    time)."""
    assert manager.leadership is not None
    manager.leadership.step()
    for server_id, token in reporting_tokens(manager).items():
        manager.ingest.accept(token, report_body(server_id, seq, load, seq))
    clock.advance(1)
    manager.tick()
    await manager.settle()


def _until(condition: object, what: str, timeout: float = 15.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def test_the_standby_takes_over_a_scale_out_without_launching_twice(
    tmp_path: Path, cluster: PostgresCluster
) -> None:
    reset_database(cluster)

    async def scenario() -> None:
        clock = FakeClock()
        a = Manager(load_manager_config(_config(tmp_path / "a", 8701, cluster)), clock=clock)
        b = Manager(load_manager_config(_config(tmp_path / "b", 8702, cluster)), clock=clock)
        try:
            await _failover(a, b, clock)
        finally:
            await _close(a, b)

    asyncio.run(scenario())


async def _failover(a: Manager, b: Manager, clock: FakeClock) -> None:
    if True:
        # One cloud account, as two managers of one deployment share it.
        _memory(b).account = _memory(a).account
        assert (a.acting, b.acting) == (True, False)
        assert b.leader_url() == (True, "http://127.0.0.1:8701")
        attach_api(b)
        standby = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=b.http_app()),
            base_url="http://b.test",
            headers=bearer(ADMIN),
        )
        seq = 1
        for _ in range(6):  # the leader publishes, reconciles, and scales out under load
            seq += 1
            await _step(a, clock, seq, 95)
        assert a.plan is not None
        launching = [s.id for s in a.fleet.servers.values() if s.state is ServerState.LAUNCHING]
        assert launching, "a scale-out is under way"

        # The standby mirrors the database: reads are served, writes go to the leader.
        b._mirror()
        status = (await standby.get("/v1/status")).json()
        assert status["manager"]["role"] == "standby"
        assert status["manager"]["epoch"] == 0
        assert {s["id"] for s in (await standby.get("/v1/servers")).json()} == set(a.fleet.servers)
        moved = await standby.post("/v1/pools", json={"name": "x"})
        assert moved.status_code == 307
        assert moved.headers["location"] == "http://127.0.0.1:8701/v1/pools"
        report = await standby.post("/v1/reports?x=1", content=b"{}")
        assert report.status_code == 307
        assert report.headers["location"] == "http://127.0.0.1:8701/v1/reports?x=1"

        # The leader dies (its tasks with it) mid-launch; the standby leads once the lease
        # expires in the database.
        for lifecycle in a.lifecycles.values():
            for task in list(lifecycle.tasks):
                task.cancel()
        await asyncio.sleep(0)
        assert b.leadership is not None
        _until(b.leadership.step, "the standby takes the expired lease over")
        assert b.leadership.epoch == 2
        await b._take_over()
        _memory(b).account = _memory(a).account  # its providers are new; the account is not
        assert b.acting and not a.acting
        assert a.tick() is None  # the old leader acts no more
        with pytest.raises(Fenced):
            a.store.set_meta("plan_version", "999")
        for _ in range(40):  # the cut launch boots (30 s) under the new leader
            seq += 1
            await _step(b, clock, seq, 50)
        assert b.plan is not None
        assert a.plan is not None
        assert (a.plan.epoch, b.plan.epoch) == (1, 2)  # pipe backends refuse a's from now on
        assert b.plan.version > a.plan.version
        status = (await standby.get("/v1/status")).json()
        assert (status["manager"]["role"], status["manager"]["epoch"]) == ("leader", 2)

        # No server launched twice, none orphaned: every machine in the account is a server
        # the new leader knows and runs, and every launch was asked for once.
        launches = _memory(a).calls + _memory(b).calls
        launched = [call.split()[1] for call in launches if call.startswith("launch ")]
        assert len(launched) == len(set(launched))
        for server_id in launching:
            assert b.fleet.servers[server_id].state in (ServerState.WARMING, ServerState.ACTIVE)
        known = {s.id for s in b.fleet.servers.values() if s.state is not ServerState.TERMINATED}
        machines = _memory(b).account.machines.values()
        assert {m.instance.server_id for m in machines} <= known
        await standby.aclose()


def test_a_standby_answers_writes_with_503_while_no_leader_is_known(
    tmp_path: Path, cluster: PostgresCluster
) -> None:
    reset_database(cluster)

    async def scenario() -> None:
        clock = FakeClock()
        a = Manager(load_manager_config(_config(tmp_path / "a", 8703, cluster)), clock=clock)
        assert a.leadership is not None
        a.leadership.step_down()  # it holds the row, but does not act: nobody leads
        assert a.leader_url() == (True, None)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=a.http_app()), base_url="http://a.test"
        )
        answer = await client.post("/v1/reports", content=b"{}")
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "1"
        assert answer.json() == {"error": "no leader"}
        assert (await client.get("/healthz")).status_code == 200
        await client.aclose()
        await a.close()

    asyncio.run(scenario())
