"""Durable state in SQLite: servers (with their state and admin flags), events, small facts.

A restarted manager reads everything back and continues: the plan version goes on from where it
was, servers keep their lifecycle state and admin flags, slow start continues from when a server
started serving, and the event log keeps growing. Writes happen on state changes, not per report
or tick, so the synchronous ``sqlite3`` module on the event loop costs little (WAL journal,
``synchronous=NORMAL``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnslb.model import Event, ServerState

SCHEMA_VERSION = 1

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
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_pool ON events (pool, id);
CREATE INDEX IF NOT EXISTS events_server ON events (server, id);
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


class StateStore:
    """The manager's SQLite database."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        found = self.get_meta("schema_version")
        if found is None:
            self.set_meta("schema_version", str(SCHEMA_VERSION))
        elif int(found) != SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path}: state schema {found}, this dnslb knows {SCHEMA_VERSION}"
            )

    def close(self) -> None:
        self._db.close()

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
            (
                record.id,
                record.pool,
                record.address,
                record.check_address,
                record.origin,
                record.state.value,
                record.state_reason,
                record.state_since,
                int(record.admin_paused),
                record.created_at,
                record.serving_since,
                record.terminated_at,
                record.max_concurrency,
                record.token_hash,
                record.provider_ref,
                json.dumps(record.data, sort_keys=True),
            ),
        )

    def load_servers(self) -> list[ServerRecord]:
        rows = self._db.execute(
            "SELECT id, pool, address, check_address, origin, state, state_reason, state_since, "
            "admin_paused, created_at, serving_since, terminated_at, max_concurrency, "
            "token_hash, provider_ref, data FROM servers ORDER BY created_at, id"
        ).fetchall()
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

    def load_servers_of(self, pool: str) -> list[ServerRecord]:
        """Every server a pool ever had, terminated ones included (for costs)."""
        return [record for record in self.load_servers() if record.pool == pool]

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
        cursor = self._db.execute(
            "INSERT INTO events (time, pool, server, kind, reason) VALUES (?, ?, ?, ?, ?)",
            (event.time, event.pool, event.server, event.kind, event.reason),
        )
        return Event(
            time=event.time,
            kind=event.kind,
            reason=event.reason,
            pool=event.pool,
            server=event.server,
            id=cursor.lastrowid,
        )

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
            f"SELECT id, time, pool, server, kind, reason FROM events {where} "  # noqa: S608
            "ORDER BY id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [
            Event(id=row[0], time=row[1], pool=row[2], server=row[3], kind=row[4], reason=row[5])
            for row in rows
        ]
