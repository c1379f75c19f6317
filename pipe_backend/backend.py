"""The pipe backend coprocess: reads PowerDNS's requests, answers from the current plan.

:class:`PipeBackend` holds one coprocess's state (the ABI version from ``HELO``, the current plan
and its compiled :class:`~pipe_backend.answers.AnswerTable`). :meth:`PipeBackend.handle` answers
one request line; :meth:`PipeBackend.serve` is the loop over file descriptors, reading whatever is
available, answering every complete line and writing all replies with one ``write``.

Between batches :meth:`PipeBackend.poll` checks, at most every ``poll_interval`` seconds, whether
the plan store's stamp changed, and whether the plan went stale. A new plan is swapped in whole;
a missing, partial or invalid one leaves the last good plan in service, logged once per change.
Bad input never stops the loop: a request that cannot be answered gets ``FAIL`` (with a ``LOG``
line saying why), and end of input is a clean exit.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable, Hashable

from dnslb import __version__
from dnslb.errors import PlanError
from dnslb.plan import Plan
from dnslb.plan_store import PlanStore
from pipe_backend.answers import AnswerTable, Reply, compile_plan
from pipe_backend.protocol import ABI_VERSIONS, AXFR_FIELDS, END, MAX_LINE, Q_FIELDS, log_fail

log = logging.getLogger("dnslb.pipe_backend")

_READ_SIZE = 65536
_PROCESS = f"{socket.gethostname()}-{os.getpid()}"


class PipeBackend:
    """One pipe backend coprocess."""

    def __init__(
        self,
        store: PlanStore,
        *,
        last_good: PlanStore | None = None,
        rng: random.Random | None = None,
        poll_interval: float = 0.25,
        stats_interval: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.last_good = last_good
        self.rng = rng if rng is not None else random.Random()
        self.poll_interval = poll_interval
        self.stats_interval = stats_interval
        self.monotonic = monotonic
        self.wall = wall
        self.abi: int | None = None
        self.plan: Plan | None = None
        self.stale = False
        self.table: AnswerTable | None = None
        self.requests = 0
        self._names: dict[bytes, dict[bytes, Reply]] = {}
        self._q_fields = 0  # no Q accepted before HELO
        self._stamp: Hashable | None = None
        self._next_poll = float("-inf")
        self._kept_version: int | None = None  # version last written to last_good
        self._keep_failed = False
        self._retired_counts: dict[str, dict[str, tuple[int, int]]] = {}
        self._next_stats = monotonic() + stats_interval
        self._stats_written_at_requests = 0
        self._stats_failed = False
        self._store_down = False

    # -- plan -----------------------------------------------------------------------------------

    def poll(self, *, force: bool = False) -> None:
        """Pick up a new plan and the plan's staleness; cheap unless something changed."""
        now = self.monotonic()
        if now < self._next_poll and not force:
            return
        self._next_poll = now + self.poll_interval
        try:
            stamp = self.store.stamp()
        except OSError as exc:  # the store is unreachable (Redis down): keep what we have
            if not self._store_down:
                keeping = f"serving plan v{self.plan.version}" if self.plan else "no plan yet"
                log.error("plan store %s unreachable (%s); %s", self.store.describe(), exc, keeping)
                self._store_down = True
            stamp = self._stamp
            force = False
            if self.plan is None and self.last_good is not None:  # a new coprocess: its copy
                kept = self._read_last_good()
                if kept is not None:
                    log.error("serving the last good plan v%d meanwhile", kept.version)
                    self._install(kept, self.last_good)
        else:
            if self._store_down:
                log.info("plan store %s reachable again", self.store.describe())
                self._store_down = False
        if stamp != self._stamp or force:
            self._stamp = stamp
            self._load(stamp)
        if self.plan is not None:
            stale = self.plan.is_stale(self.wall())
            if stale != self.stale:
                self.stale = stale
                self._log_staleness()
                self._compile()
        if now >= self._next_stats:
            self._next_stats = now + self.stats_interval
            self.write_stats()

    def _load(self, stamp: Hashable | None) -> None:
        plan, problem = self._read(stamp)
        if plan is not None:
            self._keep(plan)
            self._install(plan, self.store)
            return
        if self.plan is None and self.last_good is not None:
            kept = self._read_last_good()
            if kept is not None:
                log.error(
                    "plan %s %s; serving the last good plan v%d",
                    self.store.describe(),
                    problem,
                    kept.version,
                )
                self._install(kept, self.last_good)
                return
        keeping = f"serving plan v{self.plan.version}" if self.plan else "no plan to serve yet"
        log.error("plan %s %s; %s", self.store.describe(), problem, keeping)

    def _read(self, stamp: Hashable | None) -> tuple[Plan | None, str]:
        if self._store_down:
            return None, "is unreachable"
        if stamp is None:
            return None, "is missing"
        try:
            return self.store.read(), ""
        except (PlanError, OSError) as exc:
            return None, f"not loaded ({exc})"

    def _read_last_good(self) -> Plan | None:
        if self.last_good is None or self.last_good.stamp() is None:
            return None
        try:
            return self.last_good.read()
        except (PlanError, OSError):
            return None

    def _keep(self, plan: Plan) -> None:
        """Write ``plan`` where a coprocess started later finds it if the plan is unreadable."""
        if self.last_good is None or plan.version == self._kept_version:
            return
        try:
            self.last_good.publish(plan, durable=False)
            self._kept_version = plan.version
        except OSError as exc:
            if not self._keep_failed:
                log.warning(
                    "cannot keep a last good plan at %s: %s", self.last_good.describe(), exc
                )
                self._keep_failed = True

    def _install(self, plan: Plan, source: PlanStore) -> None:
        if self.plan is not None and plan.version < self.plan.version:
            log.warning(
                "plan %s went back from v%d to v%d; serving it",
                source.describe(),
                self.plan.version,
                plan.version,
            )
        self.plan = plan
        self.stale = plan.is_stale(self.wall())
        log.info(
            "plan v%d loaded from %s: %d zones, %d pools%s",
            plan.version,
            source.describe(),
            len(plan.zones),
            len(plan.pools),
            " (stale)" if self.stale else "",
        )
        if self.stale:
            self._log_staleness()
        self._compile()

    def _log_staleness(self) -> None:
        assert self.plan is not None
        if self.stale:
            log.warning(
                "plan v%d is older than its stale_after (%.0f s): answering with TTL floors",
                self.plan.version,
                self.plan.stale_after or 0.0,
            )
        else:
            log.info("plan v%d is fresh again", self.plan.version)

    def _compile(self) -> None:
        if self.plan is None or self.abi is None:
            return
        previous = self.table
        self.table = compile_plan(
            self.plan, self.abi, stale=self.stale, rng=self.rng, previous=previous
        )
        self._names = self.table.names
        if previous is not None:
            for key, compiled in previous.pools.items():
                if key not in self.table.pools:
                    self._retire_counts(compiled.name, compiled.answer_counts())

    def _retire_counts(self, pool: str, counts: dict[str, tuple[int, int]]) -> None:
        totals = self._retired_counts.setdefault(pool, {})
        for member, (first, seen) in counts.items():
            old_first, old_seen = totals.get(member, (0, 0))
            totals[member] = (old_first + first, old_seen + seen)

    def answer_counts(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Per pool and member: (answers it came first in, answers it was in), since start."""
        result = {pool: dict(members) for pool, members in self._retired_counts.items()}
        if self.table is not None:
            for compiled in self.table.pools.values():
                totals = result.setdefault(compiled.name, {})
                for member, (first, seen) in compiled.answer_counts().items():
                    old_first, old_seen = totals.get(member, (0, 0))
                    totals[member] = (old_first + first, old_seen + seen)
        return result

    def write_stats(self) -> None:
        """Publish the answer counts beside the plan, for the manager's metrics."""
        if self.requests == self._stats_written_at_requests:
            return
        document = {
            "process": _PROCESS,
            "written_at": self.wall(),
            "plan_version": self.plan.version if self.plan else None,
            "requests": self.requests,
            "pools": {
                pool: {member: list(pair) for member, pair in members.items()}
                for pool, members in self.answer_counts().items()
            },
        }
        try:
            self.store.write_stats(_PROCESS, document)
        except OSError as exc:
            if not self._stats_failed:
                log.warning("cannot write answer counts beside %s: %s", self.store.describe(), exc)
                self._stats_failed = True
            return
        self._stats_written_at_requests = self.requests

    # -- requests -------------------------------------------------------------------------------

    def handle(self, line: bytes) -> bytes:
        """The whole reply to one request line (without its newline)."""
        parts = line.split(b"\t")
        if parts[0] == b"Q" and len(parts) == self._q_fields:
            qname = parts[1]
            replies = self._names.get(qname.lower())
            if replies is None:
                return END
            reply = replies.get(parts[3])
            if reply is None:
                return END
            if reply.__class__ is tuple:
                return qname.join(reply)
            return qname.join(next(reply))  # type: ignore[arg-type]
        return self._handle_other(parts, line)

    def _handle_other(self, parts: list[bytes], line: bytes) -> bytes:
        tag = parts[0]
        if tag == b"Q":
            if self.abi is None:
                return log_fail("dnslb: Q before HELO")
            return log_fail(
                f"dnslb: Q with {len(parts)} fields, ABI {self.abi} has {self._q_fields}"
            )
        if tag == b"HELO":
            return self._helo(parts)
        if tag == b"AXFR":
            return self._axfr(parts)
        if tag == b"CMD":
            return self._command(b"\t".join(parts[1:]).decode("utf-8", "replace"))
        if tag == b"PING":
            return END
        shown = line[:80].decode("ascii", "backslashreplace")
        return log_fail(f"dnslb: unknown request {shown!r}")

    def _helo(self, parts: list[bytes]) -> bytes:
        version = parts[1] if len(parts) == 2 else b""
        if not version.isdigit() or int(version) not in ABI_VERSIONS:
            shown = b"\t".join(parts)[:40].decode("ascii", "backslashreplace")
            log.error("unsupported HELO %r: this backend speaks pipe ABI 1 to 5", shown)
            return log_fail("dnslb: unsupported pipe ABI version (use pipe-abi-version=1..5)")
        self.abi = int(version)
        self._q_fields = Q_FIELDS[self.abi]
        self._compile()
        plan = f"plan v{self.plan.version}" if self.plan else "no plan yet"
        banner = f"OK\tdnslb {__version__} pipe backend, ABI {self.abi}, {plan}\n"
        return banner.encode("utf-8")

    def _axfr(self, parts: list[bytes]) -> bytes:
        if self.abi is None or len(parts) != AXFR_FIELDS[self.abi]:
            return log_fail("dnslb: malformed AXFR request")
        try:
            zone_id = int(parts[1])
        except ValueError:
            return log_fail("dnslb: AXFR zone id is not a number")
        table = self.table
        if table is None or zone_id not in table.transfers:
            return log_fail(f"dnslb: no zone with id {zone_id}")
        if len(parts) == 3 and parts[2].lower().rstrip(b".") != table.zone_names[zone_id]:
            return log_fail(f"dnslb: zone id {zone_id} is not {parts[2][:255]!r}")
        return table.transfers[zone_id]

    def _command(self, text: str) -> bytes:
        words = text.split()
        command = words[0].lower() if words else "help"
        if command == "reload":
            self.poll(force=True)
            lines = ["reloaded", *self.status()]
        elif command in ("status", "version"):
            lines = self.status()
        else:
            lines = [
                "commands: status (plan version, age, source), reload (re-read the plan now), help"
            ]
            if command != "help":
                lines.insert(0, f"unknown command {command!r}")
        return "".join(f"{line}\n" for line in lines).encode("utf-8") + END

    def status(self) -> list[str]:
        """Lines describing what this coprocess serves (the CMD ``status`` reply)."""
        lines = [f"dnslb {__version__} pipe backend pid {os.getpid()}, ABI {self.abi}"]
        if self.plan is None:
            lines.append(f"plan: none loaded from {self.store.describe()}")
        else:
            age = self.plan.age(self.wall())
            lines.append(f"plan version: {self.plan.version}")
            lines.append("plan age: " + ("unknown" if age is None else f"{age:.1f} s"))
            lines.append(f"plan stale: {'yes' if self.stale else 'no'}")
            lines.append(f"plan source: {self.store.describe()}")
            lines.append(f"zones: {len(self.plan.zones)}, pools: {len(self.plan.pools)}")
        lines.append(f"requests answered: {self.requests}")
        return lines

    # -- the loop -------------------------------------------------------------------------------

    def serve(self, fd_in: int, fd_out: int) -> None:
        """Answer requests from ``fd_in`` on ``fd_out`` until end of input."""
        handle = self.handle
        pending = b""
        discarding = False  # inside a line that was too long: drop it up to its newline
        while True:
            chunk = os.read(fd_in, _READ_SIZE)
            if not chunk:
                if pending and not discarding:
                    _write_all(fd_out, handle(pending.rstrip(b"\r")))
                    self.requests += 1
                self.write_stats()  # the last counts of this coprocess
                return
            self.poll()
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if discarding and lines:
                lines.pop(0)
                discarding = False
            replies = []
            for line in lines:
                if len(line) > MAX_LINE:
                    replies.append(log_fail(f"dnslb: request longer than {MAX_LINE} bytes"))
                else:
                    replies.append(handle(line))
            if len(pending) > MAX_LINE:
                if not discarding:
                    replies.append(log_fail(f"dnslb: request longer than {MAX_LINE} bytes"))
                discarding = True
                pending = b""
            self.requests += len(replies)
            if replies:
                _write_all(fd_out, b"".join(replies))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
