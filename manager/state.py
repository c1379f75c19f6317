"""Durable state in SQLite: servers (with their state and admin flags), events, small facts.

A restarted manager reads everything back and continues: the plan version goes on from where it
was, servers keep their lifecycle state and admin flags, slow start continues from when a server
started serving, and the event log goes on. Writes happen on state changes, not per report
or tick, so the synchronous ``sqlite3`` module on the event loop costs little (WAL journal,
``synchronous=NORMAL``).

**Private files.** The database holds token hashes and admin flags: it is created mode 0600
(SQLite gives its ``-wal`` and ``-shm`` files the database's mode), and so is its directory when
the store creates it. A database found with group or other permissions is tightened to 0600, with
one warning.

**A bounded event log.** Events older than ``events_max_age`` seconds (30 days) and all but the
newest ``events_max_rows`` (1,000,000) are deleted. Pruning is cheap and occasional: every
``prune_every`` inserts or ``prune_interval`` seconds of event time, whichever comes first, at most
:data:`PRUNE_CHUNK` rows at a time (a store far behind catches up over the next inserts, never in
one long stall of the event loop), through indexes only. Age is measured from the newest event's
time, the manager's own clock, so that a store never mixes clocks (a test's fake clock, say).

**Bounded servers.** A terminated server's record is kept ``servers_max_age`` seconds (30 days)
after its termination, then deleted by the leading manager (:meth:`Store.prune_servers`, once a
minute, a chunk at a time), what it cost and served added to its pool's totals in the
``retired`` table in the same transaction: costs and served counts read the same after.

**Schema versions.** A database of an older schema is migrated when opened: schema 1 kept a
state change only as text (``"active -> draining: scale in"``); schema 2 adds the ``from_state``
and ``to_state`` columns of events, and the migration fills them from the old rows' text and keeps
the rest as their reason; schema 3 adds the ``retired`` table. A database of a newer schema than
this dnslb knows is refused.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import sqlite3
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnslb.model import Event, ServerState
from dnslb.report import MAX_SERVED

log = logging.getLogger("dnslb.manager.state")

SCHEMA_VERSION = 3


def server_row(record: ServerRecord) -> tuple[object, ...]:
    """A server as a row of the servers table, in its columns' order (both stores)."""
    return (
        record.id,
        record.pool,
        record.address,
        record.check_address,
        record.origin,
        record.state.value,
        record.state_reason,
        record.state_since,
        record.admin_paused,
        record.created_at,
        record.serving_since,
        record.terminated_at,
        record.max_concurrency,
        record.token_hash,
        record.provider_ref,
        json.dumps(record.data, sort_keys=True),
    )


_SERVERS = (
    "SELECT id, pool, address, check_address, origin, state, state_reason, state_since, "
    "admin_paused, created_at, serving_since, terminated_at, max_concurrency, "
    "token_hash, provider_ref, data FROM servers "
)

EVENTS_MAX_AGE = 30 * 86400.0
"""Default: seconds an event is kept."""
EVENTS_MAX_ROWS = 1_000_000
"""Default: events kept at most."""
PRUNE_EVERY = 1000
"""Default: inserts between two prunes."""
PRUNE_INTERVAL = 60.0
"""Default: seconds of event time between two prunes."""
PRUNE_CHUNK = 5000
"""Rows one prune deletes at most (tens of milliseconds at a million rows: see
bench/state_events.py)."""

_STATES = "|".join(state.value for state in ServerState)
_SCHEMA_1_TRANSITION = re.compile(
    rf"^(?P<from>{_STATES}) -> (?P<to>{_STATES}): (?P<reason>.*)\Z", re.DOTALL
)
"""How a schema-1 manager wrote a state change into its event's reason."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS servers (
    id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    address TEXT NOT NULL,
    check_address TEXT,
    origin TEXT NOT NULL,
    state TEXT NOT NULL,
    state_reason TEXT NOT NULL,
    state_since REAL NOT NULL,
    admin_paused INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    serving_since REAL,
    terminated_at REAL,
    max_concurrency INTEGER,
    token_hash TEXT,
    provider_ref TEXT,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS servers_pool ON servers (pool);
CREATE INDEX IF NOT EXISTS servers_terminated ON servers (terminated_at);
CREATE TABLE IF NOT EXISTS retired (
    pool TEXT PRIMARY KEY,
    seconds REAL NOT NULL,
    served INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pools (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    pool TEXT,
    server TEXT,
    kind TEXT NOT NULL,
    reason TEXT NOT NULL,
    from_state TEXT,
    to_state TEXT
);
CREATE INDEX IF NOT EXISTS events_pool ON events (pool, id);
CREATE INDEX IF NOT EXISTS events_server ON events (server, id);
CREATE INDEX IF NOT EXISTS events_time ON events (time);
"""


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """What the manager keeps about a server across restarts."""

    id: str
    pool: str
    address: str
    origin: str  # "static", or the provider that launched it
    state: ServerState
    state_reason: str
    state_since: float  # unix seconds
    created_at: float  # unix seconds (a launched server: when launch was requested)
    check_address: str | None = None
    admin_paused: bool = False
    serving_since: float | None = None  # unix seconds it last entered the answers
    terminated_at: float | None = None
    max_concurrency: int | None = None
    token_hash: str | None = None
    provider_ref: str | None = None  # the provider's id for it (instance id, pid...)
    data: dict[str, Any] = field(default_factory=dict)


def server_seconds(created_at: float, terminated_at: float | None, now: float) -> float:
    """A server's cost: seconds from its launch request (or configuration) to its termination
    (or ``now``), none when those go backwards."""
    end = terminated_at if terminated_at is not None else now
    return max(0.0, end - created_at)


def served_count(data: Any) -> int:
    """A server's ``served`` count as the state database keeps it (in its record's ``data``);
    anything else counts 0."""
    value = data.get("served", 0) if isinstance(data, dict) else 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SERVED:
        return 0
    return value


@dataclass(frozen=True, slots=True)
class Retired:
    """What a pool's pruned servers (terminated long ago, their records deleted) cost and
    served, in total."""

    seconds: float = 0.0
    served: int = 0


def checked_retired(rows: Iterable[Sequence[Any]]) -> dict[str, Retired]:
    """``(pool, seconds, served)`` rows as :class:`Retired` by pool; a row that is not a pool's
    name, a finite number of seconds at least 0 and a count within ``MAX_SERVED`` is left out
    (a store reply is checked like any input)."""
    totals: dict[str, Retired] = {}
    for row in rows:
        if len(row) != 3:
            continue
        pool, seconds, served = row
        if (
            isinstance(pool, str)
            and type(seconds) in (int, float)
            and math.isfinite(seconds)
            and seconds >= 0
            and type(served) is int
            and 0 <= served <= MAX_SERVED
        ):
            totals[pool] = Retired(float(seconds), served)
    return totals


def checked_costs(rows: Iterable[Sequence[Any]]) -> dict[str, float]:
    """``(pool, seconds)`` rows of a store's sum as a dict, a row that is not a pool's name and
    a finite number of seconds left out (a store reply is checked like any input)."""
    totals: dict[str, float] = {}
    for row in rows:
        if len(row) != 2:
            continue
        pool, seconds = row
        if (
            isinstance(pool, str)
            and type(seconds) in (int, float)
            and math.isfinite(seconds)
            and seconds >= 0
        ):
            totals[pool] = float(seconds)
    return totals


class Store(abc.ABC):
    """What the manager keeps durably, whatever holds it: :class:`StateStore` (SQLite, one host)
    or :class:`manager.postgres.PostgresStateStore` (PostgreSQL, managers in active/standby).

    Writes outside :meth:`batch` commit one by one; inside, together. A store shared by several
    managers refuses the writes of one that no longer leads
    (:class:`manager.leadership.Fenced`)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Group the writes inside into one transaction."""

    @abc.abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abc.abstractmethod
    def set_meta(self, key: str, value: str) -> None: ...

    @abc.abstractmethod
    def save_server(self, record: ServerRecord) -> None: ...

    @abc.abstractmethod
    def load_servers(self) -> list[ServerRecord]: ...

    def load_servers_of(self, pool: str) -> list[ServerRecord]:
        """Every server a pool ever had, terminated ones included (for costs)."""
        return [record for record in self.load_servers() if record.pool == pool]

    @abc.abstractmethod
    def pool_costs(self, now: float) -> dict[str, float]:
        """Each pool's server-seconds at ``now`` (unix seconds), terminated servers included:
        the sum of :func:`server_seconds` of its servers and its :class:`Retired` seconds,
        added up in SQL without reading every server (that took 80 ms at 10,000 servers, each
        time the history closed a sample); the reply checked by :func:`checked_costs`."""

    @abc.abstractmethod
    def delete_server(self, server_id: str) -> None: ...

    @abc.abstractmethod
    def terminated_before(self, before: float, limit: int) -> list[ServerRecord]:
        """Up to ``limit`` servers terminated before ``before`` (unix seconds), oldest first."""

    @abc.abstractmethod
    def retired(self) -> dict[str, Retired]:
        """Each pool's :class:`Retired` totals (pools that never had a server pruned: none),
        checked by :func:`checked_retired`."""

    @abc.abstractmethod
    def save_retired(self, pool: str, retired: Retired) -> None: ...

    def prune_servers(self, before: float, *, limit: int = PRUNE_CHUNK) -> int:
        """Delete up to ``limit`` servers terminated before ``before`` (unix seconds), oldest
        first, adding what each cost and served to its pool's :class:`Retired` totals in the
        same transaction: a pool's cost and served count read the same before and after. The
        number deleted (``limit`` or more: call again, there may be more).

        Without this the servers table grew with every scale-in, forever: every start-up, every
        takeover and every standby's refresh read it whole."""
        with self.batch():
            records = self.terminated_before(before, limit)
            if not records:
                return 0
            totals = self.retired()
            changed: dict[str, Retired] = {}
            for record in records:
                old = changed.get(record.pool) or totals.get(record.pool, Retired())
                changed[record.pool] = Retired(
                    old.seconds + server_seconds(record.created_at, record.terminated_at, before),
                    min(MAX_SERVED, old.served + served_count(record.data)),
                )
            for pool, retired in changed.items():
                self.save_retired(pool, retired)
            for record in records:
                self.delete_server(record.id)
        return len(records)

    @abc.abstractmethod
    def save_pool(self, name: str, spec: dict[str, Any], now: float) -> None: ...

    @abc.abstractmethod
    def load_pools(self) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def delete_pool(self, name: str) -> None: ...

    @abc.abstractmethod
    def add_event(self, event: Event) -> Event:
        """Store ``event``; the event with its id (inside a :meth:`batch`, a store that queues
        the batch's writes returns it with ``id`` None)."""

    @abc.abstractmethod
    def prune_events(self, now: float | None = None, *, limit: int = PRUNE_CHUNK) -> int: ...

    @abc.abstractmethod
    def count_events(self, *, pool: str | None = None, kinds: Iterable[str] = ()) -> int: ...

    @abc.abstractmethod
    def events(
        self,
        *,
        pool: str | None = None,
        server: str | None = None,
        kinds: Iterable[str] | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[Event]:
        """Events newest first, filtered; page with ``before_id`` (the last id of a page)."""


class StateStore(Store):
    """The manager's SQLite database (see the module docstring for its files and event log).

    ``events_max_age`` (seconds, 1 to 10**10) and ``events_max_rows`` (1 to 10**12) bound the
    event log; ``prune_every`` (inserts, at least 1) and ``prune_interval`` (seconds, finite, at
    least 0) say how often it is pruned. A value out of range raises ``ValueError``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        events_max_age: float = EVENTS_MAX_AGE,
        events_max_rows: int = EVENTS_MAX_ROWS,
        prune_every: int = PRUNE_EVERY,
        prune_interval: float = PRUNE_INTERVAL,
    ) -> None:
        if not (isinstance(events_max_age, int | float) and 1 <= events_max_age <= 1e10):
            raise ValueError(f"events_max_age must be 1 to 1e10 seconds, not {events_max_age!r}")
        if not (isinstance(events_max_rows, int) and 1 <= events_max_rows <= 10**12):
            raise ValueError(f"events_max_rows must be 1 to 10**12, not {events_max_rows!r}")
        if not (isinstance(prune_every, int) and prune_every >= 1):
            raise ValueError(f"prune_every must be at least 1, not {prune_every!r}")
        if not (isinstance(prune_interval, int | float) and 0 <= prune_interval < math.inf):
            raise ValueError(f"prune_interval must be finite and >= 0, not {prune_interval!r}")
        self.path = Path(path)
        self.events_max_age = float(events_max_age)
        self.events_max_rows = events_max_rows
        self.prune_every = prune_every
        self.prune_interval = float(prune_interval)
        self._inserts = 0  # since the last prune
        self._newest = -math.inf  # the newest event time seen
        self._pruned_at = -math.inf  # the event time of the last prune
        self._behind = False  # the last prune stopped at PRUNE_CHUNK rows
        self._make_private()
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        found = self.get_meta("schema_version")
        if found is None:
            self.set_meta("schema_version", str(SCHEMA_VERSION))
        elif int(found) > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path}: state schema {found}, this dnslb knows {SCHEMA_VERSION}"
            )
        elif int(found) < SCHEMA_VERSION:
            self._migrate(int(found))

    def close(self) -> None:
        self._db.close()

    def _migrate(self, version: int) -> None:
        """Bring a database of schema ``version`` up to :data:`SCHEMA_VERSION`, in one
        transaction (see the module docstring)."""
        with self.batch():
            if version < 2:
                for column in ("from_state", "to_state"):
                    self._db.execute(f"ALTER TABLE events ADD COLUMN {column} TEXT")
                rows = self._db.execute(
                    "SELECT id, reason FROM events WHERE kind = 'state'"
                ).fetchall()
                for event_id, reason in rows:
                    match = _SCHEMA_1_TRANSITION.match(reason)
                    if match is None:
                        continue  # not written by a schema-1 manager: left as it is
                    self._db.execute(
                        "UPDATE events SET from_state = ?, to_state = ?, reason = ? WHERE id = ?",
                        (match["from"], match["to"], match["reason"], event_id),
                    )
            # schema 3 adds the retired table: created by the schema script already
            self.set_meta("schema_version", str(SCHEMA_VERSION))
        log.info("%s: state schema %d migrated to %d", self.path, version, SCHEMA_VERSION)

    def _make_private(self) -> None:
        """Create the database (and its directory) readable by its owner only, and tighten
        one found readable by others, with one warning."""
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(parents=True, exist_ok=True)
            os.chmod(parent, 0o700)
        tightened, failed = [], []
        for path in (self.path, *(Path(f"{self.path}{end}") for end in ("-wal", "-shm"))):
            try:
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except FileNotFoundError:
                continue
            if mode & 0o077:
                try:
                    os.chmod(path, 0o600)
                except OSError as exc:
                    failed.append(f"{path} ({mode:04o}: {exc.strerror})")
                else:
                    tightened.append(f"{path} (was {mode:04o})")
        if tightened:
            log.warning(
                "the state database holds token hashes and admin flags and was readable by "
                "other users; tightened to 0600: %s",
                ", ".join(tightened),
            )
        if failed:
            log.warning(
                "the state database is readable by other users and could not be tightened: %s",
                ", ".join(failed),
            )
        # Created here, 0600, before SQLite opens it: SQLite would create it 0644 (under the
        # usual umask), and it gives its -wal and -shm files the database's mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group the writes inside into one transaction (one commit per tick, not per event)."""
        if self._db.in_transaction:
            yield
            return
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- meta ---------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # -- servers ------------------------------------------------------------------------------

    def save_server(self, record: ServerRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO servers (id, pool, address, check_address, origin, state, "
            "state_reason, state_since, admin_paused, created_at, serving_since, terminated_at, "
            "max_concurrency, token_hash, provider_ref, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            server_row(record),
        )

    def load_servers(self) -> list[ServerRecord]:
        return self._servers(self._db.execute(_SERVERS + "ORDER BY created_at, id"))

    def pool_costs(self, now: float) -> dict[str, float]:
        rows = self._db.execute(
            "SELECT pool, SUM(seconds) FROM ("
            "SELECT pool, MAX(0.0, COALESCE(terminated_at, ?) - created_at) AS seconds "
            "FROM servers UNION ALL SELECT pool, seconds FROM retired) GROUP BY pool",
            (now,),
        )
        return checked_costs(rows.fetchall())

    def terminated_before(self, before: float, limit: int) -> list[ServerRecord]:
        return self._servers(
            self._db.execute(
                _SERVERS + "WHERE state = 'terminated' AND terminated_at < ? "
                "ORDER BY terminated_at, id LIMIT ?",
                (before, limit),
            )
        )

    def retired(self) -> dict[str, Retired]:
        return checked_retired(self._db.execute("SELECT pool, seconds, served FROM retired"))

    def save_retired(self, pool: str, retired: Retired) -> None:
        self._db.execute(
            "INSERT INTO retired (pool, seconds, served) VALUES (?, ?, ?) ON CONFLICT (pool) "
            "DO UPDATE SET seconds = excluded.seconds, served = excluded.served",
            (pool, retired.seconds, retired.served),
        )

    def load_servers_of(self, pool: str) -> list[ServerRecord]:
        # Only the pool's rows are read and parsed (the cost of a pool's view or history).
        return self._servers(
            self._db.execute(_SERVERS + "WHERE pool = ? ORDER BY created_at, id", (pool,))
        )

    @staticmethod
    def _servers(cursor: sqlite3.Cursor) -> list[ServerRecord]:
        rows = cursor.fetchall()
        return [
            ServerRecord(
                id=row[0],
                pool=row[1],
                address=row[2],
                check_address=row[3],
                origin=row[4],
                state=ServerState(row[5]),
                state_reason=row[6],
                state_since=row[7],
                admin_paused=bool(row[8]),
                created_at=row[9],
                serving_since=row[10],
                terminated_at=row[11],
                max_concurrency=row[12],
                token_hash=row[13],
                provider_ref=row[14],
                data=json.loads(row[15]),
            )
            for row in rows
        ]

    def delete_server(self, server_id: str) -> None:
        self._db.execute("DELETE FROM servers WHERE id = ?", (server_id,))

    # -- pools created through the API --------------------------------------------------------

    def save_pool(self, name: str, spec: dict[str, Any], now: float) -> None:
        self._db.execute(
            "INSERT INTO pools (name, spec, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
            (name, json.dumps(spec, sort_keys=True), now),
        )

    def load_pools(self) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT spec FROM pools ORDER BY created_at, name").fetchall()
        return [json.loads(row[0]) for row in rows]

    def delete_pool(self, name: str) -> None:
        self._db.execute("DELETE FROM pools WHERE name = ?", (name,))

    # -- events -------------------------------------------------------------------------------

    def add_event(self, event: Event) -> Event:
        """Store ``event`` (and now and then prune old ones); the event with its id."""
        cursor = self._db.execute(
            "INSERT INTO events (time, pool, server, kind, reason, from_state, to_state) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                event.time,
                event.pool,
                event.server,
                event.kind,
                event.reason,
                _state_value(event.from_state),
                _state_value(event.to_state),
            ),
        )
        if math.isfinite(event.time):
            self._newest = max(self._newest, event.time)
        self._inserts += 1
        if (
            self._behind
            or self._inserts >= self.prune_every
            or self._newest - self._pruned_at >= self.prune_interval
        ):
            self.prune_events()
        return dataclasses.replace(event, id=cursor.lastrowid)

    def prune_events(self, now: float | None = None, *, limit: int = PRUNE_CHUNK) -> int:
        """Delete up to ``limit`` events among those older than ``events_max_age`` before
        ``now`` (default: the newest event's time) or beyond the newest ``events_max_rows``,
        oldest first; the number deleted. Both lookups go through indexes (ids, times)."""
        if now is None:
            newest = self._db.execute("SELECT MAX(time) FROM events").fetchone()[0]
            now = max(self._newest, newest if newest is not None else -math.inf)
        self._inserts = 0
        self._pruned_at = now
        deleted = 0
        newest_id = self._db.execute("SELECT MAX(id) FROM events").fetchone()[0]
        if newest_id is not None and newest_id > self.events_max_rows:
            # ids grow by one per event: every id up to newest - max_rows is beyond the newest
            # max_rows events (with gaps, a few more go).
            deleted += self._db.execute(
                "DELETE FROM events WHERE id IN "
                "(SELECT id FROM events WHERE id <= ? ORDER BY id LIMIT ?)",
                (newest_id - self.events_max_rows, limit),
            ).rowcount
        if math.isfinite(now) and deleted < limit:
            deleted += self._db.execute(
                "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE time < ? LIMIT ?)",
                (now - self.events_max_age, limit - deleted),
            ).rowcount
        self._behind = deleted >= limit
        return deleted

    def count_events(self, *, pool: str | None = None, kinds: Iterable[str] = ()) -> int:
        clauses, params = self._event_filter(pool=pool, server=None, kinds=kinds, before_id=None)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        row = self._db.execute(f"SELECT COUNT(*) FROM events {where}", params).fetchone()  # noqa: S608
        return int(row[0])

    def _event_filter(
        self,
        *,
        pool: str | None,
        server: str | None,
        kinds: Iterable[str] | None,
        before_id: int | None,
    ) -> tuple[list[str], list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if pool is not None:
            clauses.append("pool = ?")
            params.append(pool)
        if server is not None:
            clauses.append("server = ?")
            params.append(server)
        kind_list = list(kinds or [])
        if kind_list:
            clauses.append(f"kind IN ({', '.join('?' * len(kind_list))})")
            params.extend(kind_list)
        if before_id is not None:
            clauses.append("id < ?")
            params.append(before_id)
        return clauses, params

    def events(
        self,
        *,
        pool: str | None = None,
        server: str | None = None,
        kinds: Iterable[str] | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[Event]:
        """Events newest first, filtered; page with ``before_id`` (the last id of a page)."""
        clauses, params = self._event_filter(
            pool=pool, server=server, kinds=kinds, before_id=before_id
        )
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._db.execute(
            "SELECT id, time, pool, server, kind, reason, from_state, to_state "  # noqa: S608
            f"FROM events {where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [
            Event(
                id=row[0],
                time=row[1],
                pool=row[2],
                server=row[3],
                kind=row[4],
                reason=row[5],
                from_state=_state_of(row[6]),
                to_state=_state_of(row[7]),
            )
            for row in rows
        ]


def _state_value(state: ServerState | None) -> str | None:
    return None if state is None else state.value


def _state_of(value: str | None) -> ServerState | None:
    """A stored state; one this dnslb does not know (written by a newer one) reads as None."""
    if value is None:
        return None
    try:
        return ServerState(value)
    except ValueError:
        return None
