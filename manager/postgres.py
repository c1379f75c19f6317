"""Durable state in PostgreSQL, shared by managers in active/standby (``psycopg`` 3).

The same tables and contract as the SQLite :class:`~manager.state.StateStore`, in one database
that several managers reach; who of them may write is decided by the lease of
:mod:`manager.leadership`. With a ``fence`` (a leader's :meth:`Leadership.fence`), every write
transaction first checks in the database that this manager's epoch still holds: a write of a
manager that lost its lease raises :class:`~manager.leadership.Fenced` and changes nothing.

The schema is created (or migrated) when the store opens, under an advisory lock so that two
managers starting together do not race; its version is the ``schema_version`` row of
``dnslb_meta``. A database already at this version is only read (no DDL beside a leader's
writes), and a database of a newer schema than this dnslb knows is refused.

Rows are read back bounded like any input: at most :data:`MAX_SERVERS` servers and
:data:`MAX_POOLS` pools; a row whose fields are not what this dnslb writes (a wrong type, an
unknown state, text longer than :data:`MAX_TEXT`, a data document over :data:`MAX_DATA`
bytes) is skipped with one error in the log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg

from dnslb.model import Event, ServerState
from manager.leadership import LEASE_TABLE, SCHEMA_LOCK
from manager.state import (
    EVENTS_MAX_AGE,
    EVENTS_MAX_ROWS,
    PRUNE_CHUNK,
    PRUNE_EVERY,
    PRUNE_INTERVAL,
    Retired,
    ServerRecord,
    Store,
    checked_costs,
    checked_retired,
    server_row,
)

log = logging.getLogger("dnslb.manager.postgres")

DatabaseError = psycopg.Error
"""What a database that is away or refuses raises (for callers that do not import psycopg)."""

SCHEMA_VERSION = 2  # 2: the dnslb_retired table
MAX_SERVERS = 1_000_000
MAX_POOLS = 100_000
MAX_TEXT = 65536
MAX_DATA = 65536
MAX_EVENTS_PAGE = 10_000
_QUEUE_MAX = 5000  # writes a batch queues at most before it sends them
TABLES = (
    "dnslb_meta",
    "dnslb_servers",
    "dnslb_retired",
    "dnslb_pools",
    "dnslb_events",
    "dnslb_lease",
)
"""Every table dnslb makes (the lease's is :mod:`manager.leadership`'s)."""

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS dnslb_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dnslb_servers (
        id TEXT PRIMARY KEY,
        pool TEXT NOT NULL,
        address TEXT NOT NULL,
        check_address TEXT,
        origin TEXT NOT NULL,
        state TEXT NOT NULL,
        state_reason TEXT NOT NULL,
        state_since DOUBLE PRECISION NOT NULL,
        admin_paused BOOLEAN NOT NULL DEFAULT false,
        created_at DOUBLE PRECISION NOT NULL,
        serving_since DOUBLE PRECISION,
        terminated_at DOUBLE PRECISION,
        max_concurrency BIGINT,
        token_hash TEXT,
        provider_ref TEXT,
        data TEXT NOT NULL DEFAULT '{}'
    )""",
    "CREATE INDEX IF NOT EXISTS dnslb_servers_pool ON dnslb_servers (pool)",
    "CREATE INDEX IF NOT EXISTS dnslb_servers_terminated ON dnslb_servers (terminated_at)",
    """CREATE TABLE IF NOT EXISTS dnslb_retired (
        pool TEXT PRIMARY KEY,
        seconds DOUBLE PRECISION NOT NULL,
        served BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dnslb_pools (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dnslb_events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        time DOUBLE PRECISION NOT NULL,
        pool TEXT,
        server TEXT,
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        from_state TEXT,
        to_state TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS dnslb_events_pool ON dnslb_events (pool, id)",
    "CREATE INDEX IF NOT EXISTS dnslb_events_server ON dnslb_events (server, id)",
    "CREATE INDEX IF NOT EXISTS dnslb_events_time ON dnslb_events (time)",
    LEASE_TABLE,
]

_VERSION_QUERY = "SELECT value FROM dnslb_meta WHERE key = 'schema_version'"


def drop_tables(url: str) -> None:
    """Drop every dnslb table at ``url`` (a test or a benchmark starting from nothing)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {', '.join(TABLES)}")


def _schema_version(value: object) -> int:
    """The schema version a database holds; RuntimeError for one unreadable or newer."""
    if not (isinstance(value, str) and value.isdigit() and len(value) < 10):
        raise RuntimeError(f"state database: unreadable schema version {value!r:.40}")
    if int(value) > SCHEMA_VERSION:
        raise RuntimeError(f"state database: schema {value}, this dnslb knows {SCHEMA_VERSION}")
    return int(value)


_SERVER_COLUMNS = (
    "id, pool, address, check_address, origin, state, state_reason, state_since, admin_paused, "
    "created_at, serving_since, terminated_at, max_concurrency, token_hash, provider_ref, data"
)


def connect(
    url: str,
    *,
    password: str | None = None,
    sslmode: str | None = None,
    sslrootcert: str | None = None,
    connect_timeout: float = 5.0,
    statement_timeout: float = 5.0,
) -> psycopg.Connection[Any]:
    """An autocommit connection to ``url`` whose statements give up after
    ``statement_timeout`` seconds (a stalled database must not stall the manager for long)."""
    options: dict[str, Any] = {
        "autocommit": True,
        "connect_timeout": max(1, math.ceil(connect_timeout)),
        "options": f"-c statement_timeout={int(statement_timeout * 1000)}",
        "application_name": "dnslb-manager",
        # a peer gone without a word (a partition) is noticed within seconds, not hours
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
        "tcp_user_timeout": int(statement_timeout * 1000),
    }
    if password is not None:
        options["password"] = password
    if sslmode is not None:
        options["sslmode"] = sslmode
    if sslrootcert is not None:
        options["sslrootcert"] = sslrootcert
    return psycopg.connect(url, **options)


class PostgresStateStore(Store):
    """The manager's state in PostgreSQL (see the module docstring).

    ``connect()`` opens an autocommit connection (see :func:`connect`); it is called again when
    the connection broke. ``fence``, when set, is called on the connection at the start of every
    write transaction and raises :class:`~manager.leadership.Fenced` to refuse it.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        *,
        fence: Callable[[psycopg.Connection[Any]], None] | None = None,
        events_max_age: float = EVENTS_MAX_AGE,
        events_max_rows: int = EVENTS_MAX_ROWS,
        prune_every: int = PRUNE_EVERY,
        prune_interval: float = PRUNE_INTERVAL,
    ) -> None:
        if not (isinstance(events_max_age, int | float) and 1 <= events_max_age <= 1e10):
            raise ValueError(f"events_max_age must be 1 to 1e10 seconds, not {events_max_age!r}")
        if not (isinstance(events_max_rows, int) and 1 <= events_max_rows <= 10**12):
            raise ValueError(f"events_max_rows must be 1 to 10**12, not {events_max_rows!r}")
        self._connect = connect
        self.fence = fence
        self.events_max_age = float(events_max_age)
        self.events_max_rows = events_max_rows
        self.prune_every = prune_every
        self.prune_interval = float(prune_interval)
        self._inserts = 0
        self._newest = -math.inf
        self._pruned_at = -math.inf
        self._behind = False
        self._conn: psycopg.Connection[Any] = connect()
        self._in_batch = False
        self._fenced = False  # the open batch has passed its fence
        self._queue: list[tuple[str, tuple[Any, ...]]] = []  # the open batch's writes not sent yet
        self.skipped_rows = 0  # rows read back that were not what this dnslb writes
        self._create_schema()

    def _create_schema(self) -> None:
        """Create the tables, unless the database already holds this version's schema: then
        nothing but one read. ``CREATE INDEX IF NOT EXISTS`` locks its table before it finds the
        index there, so running the schema again at every open had a manager starting beside a
        busy leader take table locks in another order than the leader's writes: PostgreSQL
        found a deadlock and the starting manager exited (seen in CI)."""
        try:
            row = self._conn.execute(_VERSION_QUERY).fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
        if row is not None and _schema_version(row[0]) == SCHEMA_VERSION:
            return
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            for statement in _SCHEMA:
                self._conn.execute(statement)
            row = self._conn.execute(_VERSION_QUERY).fetchone()
            if row is None:
                self._conn.execute(
                    "INSERT INTO dnslb_meta (key, value) VALUES ('schema_version', %s)",
                    (str(SCHEMA_VERSION),),
                )
            elif _schema_version(row[0]) < SCHEMA_VERSION:
                self._conn.execute(
                    "UPDATE dnslb_meta SET value = %s WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION),),
                )

    def close(self) -> None:
        self._conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if (self._conn.closed or self._conn.broken) and not self._in_batch:
            self._conn = self._connect()
        return self._conn

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group the writes inside into one transaction; fenced at its first write."""
        if self._in_batch:
            yield
            return
        conn = self._connection()
        with conn.transaction():
            self._in_batch = True
            self._fenced = False
            try:
                yield
                self._flush()
            finally:
                self._in_batch = False
                self._queue.clear()

    def _write(self, query: str, params: tuple[Any, ...]) -> None:
        """A write; inside a batch it is queued (sent before the next read and at the end, runs
        of the same statement together: one round trip per run, not per row)."""
        if not self._in_batch:
            self._write_now(query, params)
            return
        self._fence_batch()
        self._queue.append((query, params))
        if len(self._queue) >= _QUEUE_MAX:
            self._flush()

    def _write_now(self, query: str, params: tuple[Any, ...]) -> psycopg.Cursor[Any]:
        """A write whose result is needed now (a row count, a new id)."""
        if self._in_batch:
            self._fence_batch()
            self._flush()
            return self._conn.execute(query, params)
        conn = self._connection()
        with conn.transaction():
            self._check_fence()
            return conn.execute(query, params)

    def _fence_batch(self) -> None:
        if not self._fenced:
            self._check_fence()
            self._fenced = True

    def _flush(self) -> None:
        queue, self._queue = self._queue, []
        start = 0
        while start < len(queue):
            query = queue[start][0]
            end = start
            while end < len(queue) and queue[end][0] == query:
                end += 1
            with self._conn.cursor() as cursor:
                cursor.executemany(query, [params for _, params in queue[start:end]])
            start = end

    def _check_fence(self) -> None:
        if self.fence is not None:
            self.fence(self._conn)

    def _read(self, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
        if self._queue:
            self._flush()  # a read inside a batch sees the batch's writes
        return self._connection().execute(query, params).fetchall()

    # -- meta -----------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM dnslb_meta WHERE key = %s", (key,))
        if not rows or not isinstance(rows[0][0], str) or len(rows[0][0]) > MAX_TEXT:
            return None
        return rows[0][0]

    def set_meta(self, key: str, value: str) -> None:
        self._write(
            "INSERT INTO dnslb_meta (key, value) VALUES (%s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # -- servers --------------------------------------------------------------------------------

    def save_server(self, record: ServerRecord) -> None:
        self._write(
            f"INSERT INTO dnslb_servers ({_SERVER_COLUMNS}) "  # noqa: S608 (constant columns)
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET (" + _SERVER_COLUMNS + ") = "
            "(excluded.id, excluded.pool, excluded.address, excluded.check_address, "
            "excluded.origin, excluded.state, excluded.state_reason, excluded.state_since, "
            "excluded.admin_paused, excluded.created_at, excluded.serving_since, "
            "excluded.terminated_at, excluded.max_concurrency, excluded.token_hash, "
            "excluded.provider_ref, excluded.data)",
            server_row(record),
        )

    def load_servers(self) -> list[ServerRecord]:
        rows = self._read(
            f"SELECT {_SERVER_COLUMNS} FROM dnslb_servers "  # noqa: S608 (constant columns)
            "ORDER BY state = 'terminated', created_at, id LIMIT %s",  # the living first
            (MAX_SERVERS + 1,),
        )
        if len(rows) > MAX_SERVERS:
            log.error("the state database holds over %d servers; the rest are ignored", MAX_SERVERS)
            rows = rows[:MAX_SERVERS]
        return self._records(rows)

    def pool_costs(self, now: float) -> dict[str, float]:
        rows = self._read(
            "SELECT pool, SUM(seconds) FROM ("
            "SELECT pool, GREATEST(0.0, COALESCE(terminated_at, %s) - created_at) AS seconds "
            "FROM dnslb_servers UNION ALL SELECT pool, seconds FROM dnslb_retired) AS costs "
            "GROUP BY pool",
            (now,),
        )
        return checked_costs(rows)

    def terminated_before(self, before: float, limit: int) -> list[ServerRecord]:
        rows = self._read(
            f"SELECT {_SERVER_COLUMNS} FROM dnslb_servers "  # noqa: S608 (constant columns)
            "WHERE state = 'terminated' AND terminated_at < %s ORDER BY terminated_at, id "
            "LIMIT %s",
            (before, max(0, min(limit, MAX_SERVERS))),
        )
        return self._records(rows)

    def retired(self) -> dict[str, Retired]:
        return checked_retired(
            self._read("SELECT pool, seconds, served FROM dnslb_retired LIMIT %s", (MAX_POOLS,))
        )

    def save_retired(self, pool: str, retired: Retired) -> None:
        self._write(
            "INSERT INTO dnslb_retired (pool, seconds, served) VALUES (%s, %s, %s) "
            "ON CONFLICT (pool) DO UPDATE SET seconds = excluded.seconds, served = excluded.served",
            (pool, retired.seconds, retired.served),
        )

    def load_servers_of(self, pool: str) -> list[ServerRecord]:
        """Every server a pool ever had, terminated ones included (through the pool index)."""
        rows = self._read(
            f"SELECT {_SERVER_COLUMNS} FROM dnslb_servers "  # noqa: S608 (constant columns)
            "WHERE pool = %s ORDER BY created_at, id LIMIT %s",
            (pool, MAX_SERVERS),
        )
        return self._records(rows)

    def _records(self, rows: list[tuple[Any, ...]]) -> list[ServerRecord]:
        """The servers of ``rows``; a row this store did not write is skipped and logged."""
        records = []
        for row in rows:
            record = _record_of(row)
            if record is None:
                self._skipped("server", row[0])
                continue
            records.append(record)
        return records

    def delete_server(self, server_id: str) -> None:
        self._write("DELETE FROM dnslb_servers WHERE id = %s", (server_id,))

    # -- pools ----------------------------------------------------------------------------------

    def save_pool(self, name: str, spec: dict[str, Any], now: float) -> None:
        self._write(
            "INSERT INTO dnslb_pools (name, spec, created_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
            (name, json.dumps(spec, sort_keys=True), now),
        )

    def load_pools(self) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT name, spec FROM dnslb_pools ORDER BY created_at, name LIMIT %s", (MAX_POOLS,)
        )
        pools = []
        for name, spec in rows:
            document = _json_object(spec, limit=MAX_DATA * 16)
            if document is None:
                self._skipped("pool", name)
                continue
            pools.append(document)
        return pools

    def delete_pool(self, name: str) -> None:
        self._write("DELETE FROM dnslb_pools WHERE name = %s", (name,))

    # -- events ---------------------------------------------------------------------------------

    def add_event(self, event: Event) -> Event:
        """Store ``event``; outside a batch, the event with its id (inside, its insert is queued
        and the id is not known yet: None)."""
        insert = (
            "INSERT INTO dnslb_events (time, pool, server, kind, reason, from_state, to_state) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)"
        )
        params = (
            event.time,
            event.pool,
            event.server,
            event.kind,
            event.reason,
            None if event.from_state is None else event.from_state.value,
            None if event.to_state is None else event.to_state.value,
        )
        row = None
        if self._in_batch:
            self._write(insert, params)
        else:
            row = self._write_now(insert + " RETURNING id", params).fetchone()
        if math.isfinite(event.time):
            self._newest = max(self._newest, event.time)
        self._inserts += 1
        if (
            self._behind
            or self._inserts >= self.prune_every
            or self._newest - self._pruned_at >= self.prune_interval
        ):
            self.prune_events()
        return dataclasses.replace(event, id=None if row is None else int(row[0]))

    def prune_events(self, now: float | None = None, *, limit: int = PRUNE_CHUNK) -> int:
        """As :meth:`manager.state.StateStore.prune_events`: oldest first, through indexes."""
        if now is None:
            newest = self._read("SELECT MAX(time) FROM dnslb_events")[0][0]
            now = max(self._newest, newest if isinstance(newest, float) else -math.inf)
        self._inserts = 0
        self._pruned_at = now
        deleted = 0
        newest_id = self._read("SELECT MAX(id) FROM dnslb_events")[0][0]
        if isinstance(newest_id, int) and newest_id > self.events_max_rows:
            deleted += self._write_now(
                "DELETE FROM dnslb_events WHERE id IN (SELECT id FROM dnslb_events "
                "WHERE id <= %s ORDER BY id LIMIT %s)",
                (newest_id - self.events_max_rows, limit),
            ).rowcount
        if math.isfinite(now) and deleted < limit:
            deleted += self._write_now(
                "DELETE FROM dnslb_events WHERE id IN "
                "(SELECT id FROM dnslb_events WHERE time < %s LIMIT %s)",
                (now - self.events_max_age, limit - deleted),
            ).rowcount
        self._behind = deleted >= limit
        return deleted

    def count_events(self, *, pool: str | None = None, kinds: Iterable[str] = ()) -> int:
        clauses, params = _event_filter(pool=pool, server=None, kinds=kinds, before_id=None)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        row = self._read(f"SELECT COUNT(*) FROM dnslb_events {where}", params)  # noqa: S608
        return int(row[0][0])

    def events(
        self,
        *,
        pool: str | None = None,
        server: str | None = None,
        kinds: Iterable[str] | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[Event]:
        clauses, params = _event_filter(pool=pool, server=server, kinds=kinds, before_id=before_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._read(
            "SELECT id, time, pool, server, kind, reason, from_state, to_state "  # noqa: S608
            f"FROM dnslb_events {where} ORDER BY id DESC LIMIT %s",
            (*params, max(0, min(limit, MAX_EVENTS_PAGE))),
        )
        events = []
        for row in rows:
            event = _event_of(row)
            if event is None:
                self._skipped("event", row[0])
                continue
            events.append(event)
        return events

    def _skipped(self, what: str, key: object) -> None:
        self.skipped_rows += 1
        log.error("%s %.80r in the state database is not valid; skipped", what, key)


def _event_filter(
    *, pool: str | None, server: str | None, kinds: Iterable[str] | None, before_id: int | None
) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if pool is not None:
        clauses.append("pool = %s")
        params.append(pool)
    if server is not None:
        clauses.append("server = %s")
        params.append(server)
    kind_list = list(kinds or [])
    if kind_list:
        clauses.append("kind = ANY(%s)")
        params.append(kind_list)
    if before_id is not None:
        clauses.append("id < %s")
        params.append(before_id)
    return clauses, params


def _text(value: object, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _number(value: object, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, float) and math.isfinite(value)


def _json_object(text: object, *, limit: int) -> dict[str, Any] | None:
    if not isinstance(text, str) or len(text) > limit:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _state(value: object) -> ServerState | None:
    if not isinstance(value, str):
        return None
    try:
        return ServerState(value)
    except ValueError:
        return None


def _record_of(row: tuple[Any, ...]) -> ServerRecord | None:
    """A server row as this dnslb writes it, or None."""
    (id_, pool, address, check, origin, state, reason, since, paused, created) = row[:10]
    (serving, terminated, concurrency, token, ref, data) = row[10:]
    if not all(_text(value) for value in (id_, pool, address, origin, reason)):
        return None
    if not all(_text(value, optional=True) for value in (check, token, ref)):
        return None
    if not (_number(since) and _number(created)):
        return None
    if not (_number(serving, optional=True) and _number(terminated, optional=True)):
        return None
    if concurrency is not None and not (isinstance(concurrency, int) and concurrency > 0):
        return None
    server_state = _state(state)
    document = _json_object(data, limit=MAX_DATA)
    if server_state is None or document is None or not isinstance(paused, bool):
        return None
    return ServerRecord(
        id=id_,
        pool=pool,
        address=address,
        check_address=check,
        origin=origin,
        state=server_state,
        state_reason=reason,
        state_since=since,
        admin_paused=paused,
        created_at=created,
        serving_since=serving,
        terminated_at=terminated,
        max_concurrency=concurrency,
        token_hash=token,
        provider_ref=ref,
        data=document,
    )


def _event_of(row: tuple[Any, ...]) -> Event | None:
    id_, time, pool, server, kind, reason, from_state, to_state = row
    if not (isinstance(id_, int) and _number(time) and _text(kind) and _text(reason)):
        return None
    if not (_text(pool, optional=True) and _text(server, optional=True)):
        return None
    return Event(
        id=id_,
        time=time,
        pool=pool,
        server=server,
        kind=kind,
        reason=reason,
        from_state=_state(from_state) if from_state is not None else None,
        to_state=_state(to_state) if to_state is not None else None,
    )
