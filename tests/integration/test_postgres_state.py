"""The PostgreSQL state store and the leadership lease, against a real PostgreSQL cluster
(initdb in a temporary directory): the store's contract, bounded reading, two holders, expiry
on the database's clock, and fencing (a fenced write raises and changes nothing)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from dnslb.model import Event, ServerState
from manager.config import StateConfig
from manager.leadership import Fenced, Leadership, LeaseSettings
from manager.lifecycle import server_cost
from manager.postgres import SCHEMA_VERSION, PostgresStateStore, connect
from manager.state import Retired, ServerRecord
from tests.integration.postgres import PostgresCluster, postgres_cluster, reset_database

pytestmark = pytest.mark.integration

SHORT = LeaseSettings(lease=1.0, renew=0.2, margin=0.3)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


@pytest.fixture
def db(cluster: PostgresCluster) -> Iterator[Callable[[], psycopg.Connection[Any]]]:
    reset_database(cluster)
    opened: list[psycopg.Connection[Any]] = []

    def open_one() -> psycopg.Connection[Any]:
        conn = connect(cluster.url)
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.close()


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(server_id: str, state: ServerState = ServerState.ACTIVE, **extra: Any) -> ServerRecord:
    return ServerRecord(
        id=server_id,
        pool="web",
        address="192.0.2.1",
        origin="memory",
        state=state,
        state_reason="test",
        state_since=1.5,
        created_at=1.0,
        **extra,
    )


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


# -- the store --------------------------------------------------------------------------------


def test_servers_pools_meta_and_events_round_trip(db: Callable[[], Any]) -> None:
    store = PostgresStateStore(db)
    record = _record(
        "s1",
        check_address="192.0.2.9:80",
        admin_paused=True,
        serving_since=2.0,
        max_concurrency=100,
        token_hash="h",
        provider_ref="i-1",
        data={"served": 5},
    )
    with store.batch():
        store.save_server(record)
        store.save_server(_record("s2", ServerState.LAUNCHING))
        store.set_meta("plan_version", "7")
        store.save_pool("api", {"name": "api", "zone": "example.com"}, 3.0)
    store.save_server(_record("s2", ServerState.WARMING))  # replaced, not added
    assert store.load_servers() == [record, _record("s2", ServerState.WARMING)]
    assert store.load_servers_of("other") == []
    assert store.load_servers_of("web") == store.load_servers()
    assert store.get_meta("plan_version") == "7"
    assert store.get_meta("schema_version") == str(SCHEMA_VERSION)
    assert store.load_pools() == [{"name": "api", "zone": "example.com"}]
    first = store.add_event(Event(time=10.0, kind="state", reason="up", pool="web", server="s1"))
    second = store.add_event(
        Event(
            time=11.0,
            kind="state",
            reason="down",
            pool="web",
            server="s2",
            from_state=ServerState.ACTIVE,
            to_state=ServerState.DOWN,
        )
    )
    store.add_event(Event(time=12.0, kind="pool_created", reason="made", pool="api"))
    assert first.id is not None and second.id is not None and second.id > first.id
    assert [e.reason for e in store.events()] == ["made", "down", "up"]
    assert store.events(server="s2") == [second]
    assert [e.reason for e in store.events(pool="web", before_id=second.id)] == ["up"]
    assert store.count_events(kinds=["state"]) == 2
    store.delete_server("s2")
    store.delete_pool("api")
    assert [r.id for r in store.load_servers()] == ["s1"]
    assert store.load_pools() == []
    store.close()
    reopened = PostgresStateStore(db)  # the schema is there already: opened as it is
    assert reopened.get_meta("plan_version") == "7"
    reopened.close()


def test_pool_costs_are_summed_in_the_database_as_server_cost_sums_them(
    db: Callable[[], Any],
) -> None:
    store = PostgresStateStore(db)
    records = [
        _record("s1"),  # live: created at 1.0
        _record("s2", ServerState.TERMINATED, terminated_at=41.0),
        dataclasses.replace(_record("s3"), pool="api", created_at=90.0),
        _record("s4", ServerState.TERMINATED, terminated_at=0.5),  # backwards: costs nothing
    ]
    with store.batch():
        for record in records:
            store.save_server(record)
        assert store.pool_costs(101.0) == {"web": 100.0 + 40.0, "api": 11.0}  # in the batch
    expected: dict[str, float] = {}
    for record in records:
        expected[record.pool] = expected.get(record.pool, 0.0) + server_cost(record, 101.0)
    assert store.pool_costs(101.0) == expected
    store.close()


def test_pruning_old_servers_keeps_their_pools_costs_and_served_counts(
    db: Callable[[], Any],
) -> None:
    store = PostgresStateStore(db)
    old = {"state": ServerState.TERMINATED, "data": {"served": 5}}
    records = [
        _record("old1", terminated_at=11.0, **old),
        _record("old2", terminated_at=21.0, **old),
        dataclasses.replace(_record("old3", terminated_at=31.0, **old), pool="api"),
        _record("recent", terminated_at=500.0, **old),
        _record("live"),
    ]
    for record in records:
        store.save_server(record)
    costs = store.pool_costs(1000.0)
    assert store.prune_servers(100.0, limit=2) == 2
    assert store.prune_servers(100.0) == 1
    assert sorted(r.id for r in store.load_servers()) == ["live", "recent"]
    assert store.retired() == {"web": Retired(10.0 + 20.0, 10), "api": Retired(30.0, 5)}
    assert store.pool_costs(1000.0) == costs
    store.close()


def test_a_database_of_schema_1_gets_the_retired_table(db: Callable[[], Any]) -> None:
    PostgresStateStore(db).close()
    conn = db()
    conn.execute("DROP TABLE dnslb_retired")
    conn.execute("UPDATE dnslb_meta SET value = '1' WHERE key = 'schema_version'")
    store = PostgresStateStore(db)
    assert store.get_meta("schema_version") == str(SCHEMA_VERSION)
    store.save_server(_record("s1", ServerState.TERMINATED, terminated_at=11.0))
    assert store.prune_servers(100.0) == 1
    assert store.retired() == {"web": Retired(10.0, 0)}
    store.close()


def test_a_batch_queues_its_writes_reads_see_them_and_a_failure_writes_nothing(
    db: Callable[[], Any],
) -> None:
    store = PostgresStateStore(db)
    with store.batch():
        for index in range(3):
            store.save_server(_record(f"s{index}"))
            queued = store.add_event(Event(time=float(index), kind="k", reason=str(index)))
            assert queued.id is None  # not sent yet
        store.delete_server("s1")
        assert [r.id for r in store.load_servers()] == ["s0", "s2"]  # read after the writes
        store.save_server(_record("s3"))
    assert [r.id for r in store.load_servers()] == ["s0", "s2", "s3"]
    assert [e.reason for e in store.events()] == ["2", "1", "0"]

    def failing() -> None:
        with store.batch():
            store.save_server(_record("s4"))
            store.add_event(Event(time=9.0, kind="k", reason="lost"))
            raise RuntimeError("a bug in the middle of a tick")

    with pytest.raises(RuntimeError):
        failing()
    assert [r.id for r in store.load_servers()] == ["s0", "s2", "s3"]
    assert store.count_events() == 3


def test_events_are_pruned_by_rows_and_age(db: Callable[[], Any]) -> None:
    store = PostgresStateStore(db, events_max_rows=3, events_max_age=100.0, prune_every=10**6)
    for second in range(6):
        store.add_event(Event(time=float(second), kind="k", reason=str(second)))
    assert store.prune_events() == 3
    assert [e.reason for e in store.events()] == ["5", "4", "3"]
    assert store.prune_events(now=104.5) == 2  # older than 100 s before 104.5: times 3 and 4
    assert [e.reason for e in store.events()] == ["5"]


def test_rows_that_this_dnslb_did_not_write_are_skipped(db: Callable[[], Any]) -> None:
    store = PostgresStateStore(db)
    store.save_server(_record("good"))
    store.save_server(_record("bad-state"))
    store.save_server(_record("bad-data"))
    raw = db()
    raw.execute("UPDATE dnslb_servers SET state = 'exploded' WHERE id = 'bad-state'")
    raw.execute("UPDATE dnslb_servers SET data = %s WHERE id = 'bad-data'", ("[" * 70000,))
    raw.execute("INSERT INTO dnslb_pools VALUES ('p', 'not json', 0)")
    raw.execute("INSERT INTO dnslb_events (time, kind, reason) VALUES ('NaN', 'k', 'r')")
    assert [r.id for r in store.load_servers()] == ["good"]
    assert store.load_pools() == []
    assert store.events() == []
    assert store.skipped_rows == 4


def test_a_newer_schema_is_refused(db: Callable[[], Any]) -> None:
    PostgresStateStore(db).close()
    db().execute("UPDATE dnslb_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(RuntimeError, match=f"schema 99, this dnslb knows {SCHEMA_VERSION}"):
        PostgresStateStore(db)


def test_opening_beside_a_writer_takes_no_table_lock(cluster: PostgresCluster, db: Any) -> None:
    """A manager starting while the leader's write transaction is open: the schema is there,
    so the open only reads. (Running the schema again took ShareLock on the tables the leader
    was writing, in another order: a deadlock in CI, the starting manager exited.)"""
    PostgresStateStore(db).close()
    writer = db()
    with writer.transaction():
        writer.execute(
            "INSERT INTO dnslb_events (time, kind, reason) VALUES (1, 'test', 'held open')"
        )
        writer.execute("UPDATE dnslb_servers SET state = state")
        impatient = connect(cluster.url, statement_timeout=1.0)  # a lock wait fails in 1 s
        PostgresStateStore(lambda: impatient).close()


# -- the lease --------------------------------------------------------------------------------


def test_one_holder_leads_the_other_learns_where(db: Callable[[], Any]) -> None:
    a = Leadership(db, url="http://a:8080", settings=SHORT, holder="a")
    b = Leadership(db, url="http://b:8080", settings=SHORT, holder="b")
    assert a.step() is True
    assert a.epoch == 1
    assert b.step() is False
    assert b.leader is not None and (b.leader.holder, b.leader.url) == ("a", "http://a:8080")
    assert a.step() is True  # renewed: same epoch
    assert a.epoch == 1
    assert b.step() is False


def test_an_expired_lease_is_taken_over_with_a_new_epoch(db: Callable[[], Any]) -> None:
    clock = FakeMonotonic()
    a = Leadership(db, url="http://a:8080", settings=SHORT, holder="a", monotonic=clock)
    b = Leadership(db, url="http://b:8080", settings=SHORT, holder="b")
    assert a.step() is True
    # a stops renewing (partitioned, paused); b takes over once the DATABASE says it expired.
    _wait_for(b.step, "b takes the expired lease over")
    assert b.epoch == 2
    # a's own deadline: the time its renewal was sent + lease - margin, on its own clock
    assert a.leading() is True
    clock.now += SHORT.lease - SHORT.margin
    assert a.leading() is False
    assert a.step() is False  # it cannot renew: b holds it
    assert a.leader is not None and a.leader.holder == "b"


def test_a_released_lease_is_taken_at_once(db: Callable[[], Any]) -> None:
    a = Leadership(db, url="http://a:8080", settings=LeaseSettings(), holder="a")
    b = Leadership(db, url="http://b:8080", settings=LeaseSettings(), holder="b")
    assert a.step() is True
    assert b.step() is False
    a.release()
    assert a.leading() is False
    assert b.step() is True
    assert b.epoch == 2


def test_a_fenced_write_raises_and_changes_nothing(db: Callable[[], Any]) -> None:
    clock = FakeMonotonic()  # frozen: a believes it still leads (a paused process, say)
    a = Leadership(db, url="http://a:8080", settings=SHORT, holder="a", monotonic=clock)
    b = Leadership(db, url="http://b:8080", settings=SHORT, holder="b")
    assert a.step() is True
    store_a = PostgresStateStore(db, fence=a.fence)
    store_a.save_server(_record("s1"))  # a leads: written
    _wait_for(b.step, "b takes the expired lease over")
    assert a.leading() is True  # as far as a's clock knows
    with pytest.raises(Fenced, match="epoch 1 has passed"):
        store_a.save_server(_record("s1", ServerState.DRAINING))
    assert a.leading() is False  # stepped down
    with pytest.raises(Fenced), store_a.batch():
        store_a.add_event(Event(time=1.0, kind="k", reason="after"))
    store_b = PostgresStateStore(db, fence=b.fence)
    assert store_b.load_servers() == [_record("s1")]  # unchanged
    assert store_b.events() == []
    store_b.save_server(_record("s2"))  # b leads: written
    assert [r.id for r in store_b.load_servers()] == ["s1", "s2"]
    store_b.save_server(_record("t", ServerState.TERMINATED, terminated_at=2.0))
    with pytest.raises(Fenced):  # a's prune too: nothing deleted, nothing retired
        store_a.prune_servers(1e12)
    assert [r.id for r in store_b.load_servers()] == ["s1", "s2", "t"]
    assert store_b.retired() == {}


def test_a_batch_fenced_at_its_first_write_writes_nothing(db: Callable[[], Any]) -> None:
    clock = FakeMonotonic()
    a = Leadership(db, url="http://a:8080", settings=SHORT, holder="a", monotonic=clock)
    b = Leadership(db, url="http://b:8080", settings=SHORT, holder="b")
    assert a.step() is True
    store_a = PostgresStateStore(db, fence=a.fence)
    _wait_for(b.step, "b takes the expired lease over")

    def two_writes() -> None:
        with store_a.batch():
            store_a.save_server(_record("s1"))
            store_a.set_meta("plan_version", "9")

    with pytest.raises(Fenced):
        two_writes()
    assert store_a.load_servers() == []
    assert store_a.get_meta("plan_version") is None


def test_a_standby_store_refuses_writes(db: Callable[[], Any]) -> None:
    a = Leadership(db, url="http://a:8080", settings=SHORT, holder="a")
    b = Leadership(db, url="http://b:8080", settings=SHORT, holder="b")
    assert a.step() is True
    assert b.step() is False
    with pytest.raises(Fenced, match="does not lead"):
        PostgresStateStore(db, fence=b.fence).save_server(_record("s1"))


def test_a_lost_database_ends_leadership_at_the_local_deadline(
    db: Callable[[], Any], cluster: PostgresCluster
) -> None:
    clock = FakeMonotonic()
    a = Leadership(db, url="http://a:8080", settings=SHORT, holder="a", monotonic=clock)
    assert a.step() is True
    cluster.stop()
    try:
        clock.now += 0.1
        assert a.step() is True  # the renewal failed; still within the last lease
        assert a.errors == 1
        clock.now += SHORT.lease - SHORT.margin
        assert a.step() is False
    finally:
        cluster.start()


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        pytest.param(LeaseSettings(lease=6.0, renew=2.0), "renew (2) must be below", id="renew"),
        pytest.param(
            LeaseSettings(lease=10.0, margin=8.0), "margin (8) must be below", id="margin"
        ),
    ],
)
def test_lease_settings_are_checked(settings: LeaseSettings, problem: str) -> None:
    assert any(problem in text for text in settings.config_problems())
    with pytest.raises(ValueError, match="must be below"):
        Leadership(lambda: None, url="http://a", settings=settings)  # type: ignore[arg-type,return-value]


def test_state_config_checks_the_url() -> None:
    assert list(StateConfig(url="mysql://x/y").config_problems()) == [
        "url: 'mysql://x/y' must be a postgresql:// URL"
    ]
    assert "password" in next(iter(StateConfig(url="postgresql://u:pw@h/d").config_problems()))
    assert list(StateConfig(url="postgresql://u@h:5432/d").config_problems()) == []
    assert list(StateConfig(sslmode="require").config_problems()) == [
        "sslmode: only for PostgreSQL (set url)"
    ]
