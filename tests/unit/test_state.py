"""The state database: private files (0600, whatever the umask), a bounded event log, state
changes as fields of their events, and older schemas migrated."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dnslb.model import Event, ServerState
from manager.lifecycle import server_cost
from manager.state import (
    PRUNE_CHUNK,
    SCHEMA_VERSION,
    Retired,
    ServerRecord,
    StateStore,
    checked_costs,
    checked_retired,
)

T0 = 1_700_000_000.0


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def event(time: float, number: int = 0) -> Event:
    return Event(time=time, kind="test", reason=f"event {number}", pool="www", server="s1")


def times(store: StateStore) -> list[float]:
    return sorted(e.time for e in store.events(limit=10**9))


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: files are as private as the code makes them, not the umask."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# -- private files -----------------------------------------------------------------------------


@pytest.mark.usefixtures("open_umask")
def test_a_new_database_its_journal_files_and_its_new_directory_are_private(
    tmp_path: Path,
) -> None:
    path = tmp_path / "var" / "dnslb" / "state.db"
    store = StateStore(path)
    store.add_event(event(T0))  # the WAL and shared-memory files exist once written
    try:
        files = {p.name: mode(p) for p in path.parent.iterdir()}
        assert files == {"state.db": 0o600, "state.db-wal": 0o600, "state.db-shm": 0o600}
        assert mode(path.parent) == 0o700
    finally:
        store.close()


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    StateStore(tmp_path / "state.db").close()
    assert mode(tmp_path) == 0o755
    assert mode(tmp_path / "state.db") == 0o600


def test_a_database_readable_by_others_is_tightened_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)  # as an earlier dnslb made it: 0644, open with its WAL file
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (x)")
        db.commit()
        os.chmod(path, 0o644)
        os.chmod(tmp_path / "state.db-wal", 0o666)
        with caplog.at_level(logging.WARNING, logger="dnslb.manager.state"):
            store = StateStore(path)
            store.add_event(event(T0))
            store.close()
            StateStore(path).close()  # already private: no second warning
    finally:
        db.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "tightened to 0600" in warnings[0]
    assert "state.db (was 0644)" in warnings[0]
    assert "state.db-wal (was 0666)" in warnings[0]
    assert mode(path) == 0o600
    assert all(mode(p) == 0o600 for p in tmp_path.iterdir() if p.name.startswith("state.db"))


# -- a bounded event log -----------------------------------------------------------------------


def test_the_oldest_events_beyond_the_row_limit_are_deleted(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db", events_max_rows=100, prune_every=10)
    with store.batch():
        for number in range(1000):
            store.add_event(event(T0, number))
    kept = store.events(limit=10**9)
    assert 100 <= len(kept) <= 110  # pruned every 10 inserts
    assert kept[0].reason == "event 999"  # the newest are kept, the oldest go
    assert {e.reason for e in kept} == {f"event {n}" for n in range(1000 - len(kept), 1000)}


def test_events_older_than_the_age_limit_are_deleted(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db", events_max_age=3600, prune_interval=60)
    for minute in range(180):  # three hours, one event a minute
        store.add_event(event(T0 + 60 * minute, minute))
    newest = T0 + 60 * 179
    kept = times(store)
    # Pruned once a minute of event time: at most a minute more than the limit is left.
    assert kept[0] >= newest - 3600 - 60
    assert kept == [T0 + 60 * m for m in range(180) if T0 + 60 * m >= kept[0]]
    assert len(kept) >= 60


def test_pruning_is_occasional_not_on_every_insert(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db", events_max_rows=10, prune_every=1000)
    store.add_event(event(T0, 0))  # the first insert prunes (there is nothing to prune)
    for number in range(1, 1000):  # one instant: no prune is due by time either
        store.add_event(event(T0, number))
    assert store.count_events() == 1000  # 999 inserts, no prune
    store.add_event(event(T0, 1000))  # the 1000th insert since the last prune
    assert store.count_events() == 10


def test_a_store_far_behind_catches_up_in_bounded_steps(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    big = StateStore(path)
    with big.batch():
        for number in range(PRUNE_CHUNK + 500):
            big.add_event(event(T0, number))
    big.close()
    store = StateStore(path, events_max_rows=100)
    assert store.prune_events(limit=300) == 300  # never more than asked
    store.add_event(event(T0, -1))  # a prune: at most PRUNE_CHUNK rows
    assert store.count_events() == PRUNE_CHUNK + 500 + 1 - 300 - PRUNE_CHUNK
    store.add_event(event(T0, -2))  # behind: the next insert prunes again
    assert store.count_events() == 100
    assert store.prune_events() == 0


def test_age_is_measured_on_the_events_own_clock(tmp_path: Path) -> None:
    """Events stamped by a fake clock years ago are not 'old' to a store: only the newest event's
    time counts, never the machine's clock."""
    store = StateStore(tmp_path / "state.db", events_max_age=3600, prune_every=1)
    for number in range(5):
        store.add_event(event(1000.0 + number, number))
    assert store.count_events() == 5
    store.add_event(event(1000.0 + 7200, 5))
    assert times(store) == [8200.0]


def test_an_empty_store_prunes_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    assert store.prune_events() == 0
    assert store.prune_events(now=T0) == 0


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"events_max_age": math.nan}, id="nan age"),
        pytest.param({"events_max_age": math.inf}, id="infinite age"),
        pytest.param({"events_max_age": 0}, id="zero age"),
        pytest.param({"events_max_rows": 0}, id="no rows"),
        pytest.param({"events_max_rows": 10**13}, id="too many rows"),
        pytest.param({"events_max_rows": 1.5}, id="fractional rows"),
        pytest.param({"prune_every": 0}, id="never prune"),
        pytest.param({"prune_interval": math.inf}, id="infinite interval"),
        pytest.param({"prune_interval": -1}, id="negative interval"),
    ],
)
def test_limits_out_of_range_are_refused(tmp_path: Path, settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        StateStore(tmp_path / "state.db", **settings)  # type: ignore[arg-type]
    assert not (tmp_path / "state.db").exists()


# -- state changes and schemas ----------------------------------------------------------------


def test_a_state_change_keeps_its_states_as_fields(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    change = Event(
        time=T0,
        kind="state",
        reason="reporting",
        pool="www",
        server="s1",
        from_state=ServerState.WARMING,
        to_state=ServerState.ACTIVE,
    )
    stored = store.add_event(change)
    store.add_event(event(T0 + 1))
    newest, oldest = store.events()
    assert oldest == stored and stored.id is not None
    assert (oldest.from_state, oldest.to_state, oldest.reason) == (
        ServerState.WARMING,
        ServerState.ACTIVE,
        "reporting",
    )
    assert oldest.summary == "warming -> active: reporting"
    assert (newest.from_state, newest.to_state, newest.summary) == (None, None, "event 0")


SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    pool TEXT,
    server TEXT,
    kind TEXT NOT NULL,
    reason TEXT NOT NULL
);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO events (time, pool, server, kind, reason) VALUES
    (1.0, 'www', 's1', 'state', 'launching -> warming: running at 10.0.0.1 (i-1)'),
    (2.0, 'www', 's1', 'state', 'warming -> active: reporting: a -> b: c'),
    (3.0, 'www', 's1', 'state', 'something -> else: not a state of ours'),
    (4.0, 'www', NULL, 'scale_out', '1: active -> draining is not a change');
"""


def test_a_schema_1_database_is_migrated_and_its_changes_become_fields(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(SCHEMA_1)
    store = StateStore(path)
    assert store.get_meta("schema_version") == str(SCHEMA_VERSION)
    found = [(e.id, e.from_state, e.to_state, e.reason) for e in reversed(store.events())]
    assert found == [
        (1, ServerState.LAUNCHING, ServerState.WARMING, "running at 10.0.0.1 (i-1)"),
        (2, ServerState.WARMING, ServerState.ACTIVE, "reporting: a -> b: c"),
        (3, None, None, "something -> else: not a state of ours"),
        (4, None, None, "1: active -> draining is not a change"),
    ]
    added = store.add_event(event(5.0))
    assert added.id == 5
    store.close()
    again = StateStore(path)  # migrated once: opened again as it is
    assert [e.summary for e in again.events(kinds=["state"])][-1] == (
        "launching -> warming: running at 10.0.0.1 (i-1)"
    )


def test_a_database_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateStore(path).set_meta("schema_version", str(SCHEMA_VERSION + 1))
    with pytest.raises(RuntimeError, match=f"state schema {SCHEMA_VERSION + 1}"):
        StateStore(path)


# -- costs -------------------------------------------------------------------------------------


def _server(server_id: str, pool: str, created_at: float, terminated_at: float | None):
    return ServerRecord(
        id=server_id,
        pool=pool,
        address="192.0.2.1",
        origin="memory",
        state=ServerState.TERMINATED if terminated_at is not None else ServerState.ACTIVE,
        state_reason="test",
        state_since=created_at,
        created_at=created_at,
        terminated_at=terminated_at,
    )


def _fields(record: ServerRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in ServerRecord.__slots__}


def test_pool_costs_are_summed_in_sql_as_server_cost_sums_them(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    records = [
        _server("s1", "web", T0, None),
        _server("s2", "web", T0 + 10, T0 + 70),
        _server("s3", "api", T0 + 50, None),
        _server("s4", "api", T0 + 50, T0 + 20),  # a clock that went back costs nothing
    ]
    for record in records:
        store.save_server(record)
    now = T0 + 100
    expected: dict[str, float] = {}
    for record in records:
        expected[record.pool] = expected.get(record.pool, 0.0) + server_cost(record, now)
    assert store.pool_costs(now) == pytest.approx(expected)
    assert expected == {"web": 160.0, "api": 50.0}
    store.close()


def test_pruning_old_servers_keeps_their_pools_costs_and_served_counts(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    records = [
        _server("old1", "web", T0, T0 + 100),
        _server("old2", "web", T0 + 10, T0 + 200),
        _server("old3", "api", T0, T0 + 50),
        _server("recent", "web", T0, T0 + 5000),  # terminated after the cut-off: kept
        _server("live", "web", T0, None),  # never pruned, however old
    ]
    for record in records:
        store.save_server(ServerRecord(**{**_fields(record), "data": {"served": 7}}))
    now = T0 + 9000
    costs = store.pool_costs(now)

    assert store.prune_servers(T0 + 1000, limit=2) == 2  # a chunk: the two oldest
    assert store.prune_servers(T0 + 1000, limit=2) == 1
    assert store.prune_servers(T0 + 1000) == 0

    assert sorted(r.id for r in store.load_servers()) == ["live", "recent"]
    assert store.retired() == {"web": Retired(100.0 + 190.0, 14), "api": Retired(50.0, 7)}
    assert store.pool_costs(now) == pytest.approx(costs)
    store.close()


def test_pruning_adds_to_what_an_earlier_prune_retired(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    store.save_server(_server("a", "web", T0, T0 + 10))
    store.prune_servers(T0 + 100)
    store.save_server(_server("b", "web", T0, T0 + 20))
    store.prune_servers(T0 + 100)
    assert store.retired() == {"web": Retired(30.0, 0)}
    assert store.pool_costs(T0 + 100) == {"web": 30.0}
    store.close()


def test_a_prune_that_fails_changes_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    store.save_server(_server("a", "web", T0, T0 + 10))

    def broken(pool: str, retired: Retired) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    store.save_retired = broken  # type: ignore[method-assign]
    with pytest.raises(sqlite3.OperationalError):
        store.prune_servers(T0 + 100)
    assert [r.id for r in store.load_servers()] == ["a"]  # the delete rolled back with it
    assert store.pool_costs(T0 + 100) == {"web": 10.0}
    store.close()


def test_a_store_reply_that_is_not_a_retired_total_is_left_out() -> None:
    rows = [
        ("web", 10.0, 3),
        ("nan", float("nan"), 1),
        ("neg", -1.0, 1),
        ("big", 1.0, 2**63),
        ("bool", 1.0, True),
        (3, 1.0, 1),
        ("short", 1.0),
    ]
    assert checked_retired(rows) == {"web": Retired(10.0, 3)}


def test_a_store_reply_that_is_not_a_cost_is_left_out() -> None:
    rows = [("web", 10.0), ("api", float("nan")), ("x", -1.0), (3, 4.0), ("y", "5"), ("z",)]
    assert checked_costs(rows) == {"web": 10.0}
