"""Which manager leads: a lease in PostgreSQL with a fencing epoch.

Several managers share one PostgreSQL database; one row of ``dnslb_lease`` says who leads
(``holder``), since which takeover (``epoch``), where it answers (``url``) and until when
(``expires_at``, on the DATABASE's clock: the managers' clocks are never compared). Every
``renew`` seconds each manager runs one statement:

- the holder renews its row while it is valid (same epoch);
- anyone takes an expired row over, with ``epoch + 1``;
- otherwise nothing changes, and the manager learns who leads (for redirects).

**A leader stops before its lease can expire.** The leader believes it leads only until the
local monotonic time at which its last successful renewing statement was SENT, plus ``lease``,
minus ``margin``: the database set ``expires_at`` after that statement arrived, so a leader cut
off from the database stops acting at least ``margin`` seconds before anyone else can take over
(clock rates differ by far less than that).

**Fencing.** A leader that stalled (a long pause, a partition) may still send writes after its
lease passed to another. Every state write of a leader is therefore conditional on its epoch
(:meth:`Leadership.fence`): the write's transaction first updates the lease row where epoch and
holder are still its own; zero rows raises :class:`Fenced` and the transaction is rolled back.
That update also locks the row until the transaction ends, so a takeover waits for a write in
flight and every write lands entirely before the new epoch, or not at all.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dnslb.config import setting
from dnslb.errors import DnslbError
from dnslb.plan import MAX_EPOCH  # every epoch must fit in a plan

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("dnslb.manager.leadership")

MAX_URL = 2048
"""Longest advertised URL read back from the lease row (longer ones are ignored)."""
MAX_HOLDER = 256
SCHEMA_LOCK = 0x646E736C62  # "dnslb": the advisory lock held while tables are created

LEASE_TABLE = """
CREATE TABLE IF NOT EXISTS dnslb_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    url TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
)
"""

# One statement: renew while held (same holder and epoch, not expired), take over when expired
# (epoch + 1), else change nothing. RETURNING reports the row as it is after the statement.
_STEP = """
INSERT INTO dnslb_lease AS lease (id, holder, epoch, url, expires_at)
VALUES (1, %(holder)s, 1, %(url)s, now() + %(lease)s * interval '1 second')
ON CONFLICT (id) DO UPDATE SET
    holder = excluded.holder,
    url = excluded.url,
    expires_at = excluded.expires_at,
    epoch = CASE
        WHEN lease.holder = excluded.holder AND lease.epoch = %(epoch)s AND lease.expires_at > now()
        THEN lease.epoch
        ELSE lease.epoch + 1
    END
WHERE (lease.holder = excluded.holder AND lease.epoch = %(epoch)s AND lease.expires_at > now())
    OR lease.expires_at <= now()
RETURNING holder, epoch, url
"""

_CURRENT = "SELECT holder, epoch, url, expires_at > now() FROM dnslb_lease WHERE id = 1"

_FENCE = "UPDATE dnslb_lease SET holder = holder WHERE id = 1 AND epoch = %s AND holder = %s"

_RELEASE = (
    "UPDATE dnslb_lease SET expires_at = now() - interval '1 second' "
    "WHERE id = 1 AND epoch = %s AND holder = %s"
)


class Fenced(DnslbError):
    """A write of a manager that no longer leads (its epoch has passed): nothing was written."""


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """How long a leadership lease lasts and how often it is renewed."""

    lease: float = setting(
        10.0, help="seconds a leader's lease lasts in the database", min=1.0, max=3600.0
    )
    renew: float = setting(
        2.0, help="seconds between renewals (below lease / 3)", min=0.1, max=1200.0
    )
    margin: float = setting(
        2.0,
        help="a leader stops acting this many seconds before its lease can expire "
        "(below lease - renew)",
        min=0.1,
        max=3600.0,
    )

    def config_problems(self) -> list[str]:
        problems = []
        if not self.renew < self.lease / 3:
            problems.append(f"renew ({self.renew:g}) must be below lease / 3 ({self.lease / 3:g})")
        if not self.margin < self.lease - self.renew:
            problems.append(
                f"margin ({self.margin:g}) must be below lease - renew "
                f"({self.lease - self.renew:g})"
            )
        return problems


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads, as last read: its holder id, epoch and advertised URL (None: nobody)."""

    holder: str
    epoch: int
    url: str | None


def holder_id() -> str:
    """A holder id unique to this process (a restarted manager is a new holder)."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{secrets.token_hex(4)}"


class Leadership:
    """One manager's view of the lease, kept on a connection of its own.

    ``connect()`` opens a new autocommit connection (called again after a failure).
    :meth:`step` runs one acquire-or-renew statement (blocking: run it in a thread);
    :meth:`leading` says whether this manager may act now. ``monotonic`` is the local clock.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        *,
        url: str,
        settings: LeaseSettings | None = None,
        holder: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or LeaseSettings()
        problems = self.settings.config_problems()
        if problems:
            raise ValueError("; ".join(problems))
        self._connect = connect
        self.url = url
        self.holder = holder or holder_id()
        self.monotonic = monotonic
        self.epoch: int | None = None  # the epoch of this manager's lease, while it holds one
        self.leader: Leader | None = None  # who leads, as last read
        self._valid_until = -math.inf
        self._conn: psycopg.Connection[Any] | None = None
        self.errors = 0  # statements that failed (database unreachable...)

    def leading(self) -> bool:
        """True while this manager holds the lease and may act (see the module docstring)."""
        return self.epoch is not None and self.monotonic() < self._valid_until

    def step(self) -> bool:
        """Renew or acquire the lease; whether this manager leads afterwards. A database error
        is logged and counted; leadership then runs out at its local deadline."""
        try:
            conn = self._connection()
            sent = self.monotonic()
            row = conn.execute(
                _STEP,
                {
                    "holder": self.holder,
                    "url": self.url,
                    "lease": self.settings.lease,
                    "epoch": self.epoch if self.epoch is not None else -1,
                },
            ).fetchone()
            if row is None:
                current = conn.execute(_CURRENT).fetchone()
                self._lost()
                self.leader = _leader_of(current)
            else:
                leader = _leader_of((*row, True))
                if leader is None or leader.holder != self.holder:  # cannot happen: RETURNING
                    self._lost()
                    self.leader = leader
                else:
                    if leader.epoch != self.epoch:
                        log.warning("leading the managers, epoch %d", leader.epoch)
                    self.epoch = leader.epoch
                    self.leader = leader
                    self._valid_until = sent + self.settings.lease - self.settings.margin
        except Exception as exc:  # psycopg.Error, OSError: the database is away
            self.errors += 1
            self._drop_connection()
            if self.errors == 1 or self.errors % 30 == 0:
                log.error("leadership lease: %s (%d errors)", str(exc)[:300], self.errors)
        return self.leading()

    def fence(self, conn: psycopg.Connection[Any]) -> None:
        """Inside a write transaction on ``conn``: raise :class:`Fenced` unless this manager's
        epoch still holds the lease (and lock the lease row until the transaction ends)."""
        if self.epoch is None or not self.leading():
            raise Fenced("this manager does not lead")
        cursor = conn.execute(_FENCE, (self.epoch, self.holder))
        if cursor.rowcount != 1:
            epoch = self.epoch
            self._lost()
            raise Fenced(f"epoch {epoch} has passed: another manager leads")

    def step_down(self) -> None:
        """Stop acting at once (a fenced write, a lost database)."""
        self._lost()

    def release(self) -> None:
        """Give the lease up (a clean shutdown): a standby takes over at its next renewal."""
        epoch = self.epoch
        self._lost()
        if epoch is None:
            return
        try:
            self._connection().execute(_RELEASE, (epoch, self.holder))
        except Exception as exc:  # the lease expires anyway
            log.warning("could not release the lease: %s", str(exc)[:300])

    def close(self) -> None:
        self._drop_connection()

    def _lost(self) -> None:
        if self.epoch is not None:
            log.warning("no longer leading (epoch %d)", self.epoch)
        self.epoch = None
        self._valid_until = -math.inf

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = self._connect()
            with conn.transaction():  # the table, should the state store not have made it yet
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                conn.execute(LEASE_TABLE)
            self._conn = conn
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to do
                self._conn.close()
            self._conn = None


def _leader_of(row: tuple[Any, ...] | None) -> Leader | None:
    """The lease row as read back, bounded like any input; None when nobody validly leads."""
    if row is None or len(row) != 4:
        return None
    holder, epoch, url, valid = row
    if valid is not True or not isinstance(holder, str) or len(holder) > MAX_HOLDER:
        return None
    if not isinstance(epoch, int) or not 0 < epoch <= MAX_EPOCH:
        return None
    good_url = (
        isinstance(url, str)
        and 0 < len(url) <= MAX_URL
        and url.startswith(("http://", "https://"))
        and url.isprintable()
    )
    return Leader(holder=holder, epoch=epoch, url=url if good_url else None)
