"""The pipe backend coprocess: reads PowerDNS's requests, answers from the current plan.

:class:`PipeBackend` holds one coprocess's state (the ABI version from ``HELO``, the current plan
and its compiled :class:`~pipe_backend.answers.AnswerTable`). :meth:`PipeBackend.handle` answers
one request line; :meth:`PipeBackend.serve` is the loop over file descriptors, reading whatever is
available, answering every complete line and writing all replies with one ``write``.

The query loop never waits on I/O for plans. A loader thread (:meth:`PipeBackend.refresh`, every
``poll_interval`` seconds) checks the plan store's stamp, reads, parses and compiles a new plan,
notices when the plan goes stale, and writes the answer counts; the query loop takes a finished
table between batches (:meth:`PipeBackend.take`), which costs one attribute check. A slow, hung or
hostile store delays only the loader. A new plan is swapped in whole; a missing, partial, invalid
or uncompilable one leaves the last good plan in service, logged once per change. A plan is
copied to ``last_good`` only after it compiled, and a coprocess whose store is unreadable serves
that copy when it is newer than its own: every coprocess, busy or idle, ends up on the newest good
plan.

Plans are ordered by (``epoch``, ``version``) (:func:`plan_order`) and never go back: a plan older
than the one in service is refused (logged once, counted in ``status`` and the stats), and a
coprocess's first plan must not be older than the last good copy, which the coprocesses before it
served. A manager elected later has a higher epoch, so a deposed one still writing is ignored.

A big plan must not stall answers either (``bench/fleet_plan.py``, ``docs/pdns.md``): the store
validates only pools whose text changed (:class:`~dnslb.plan.PoolCache`) and the compiler reuses
unchanged pools' replies and transfer lines, and a changed pool's cycles whose inputs did not
change (:func:`~dnslb.selection.family_key`); pools are compared, never hashed; reading,
compiling, counting and freeing rest 0.8 ms after each 0.2 ms, with places to rest close
enough that no stretch of the loader's work holds a CPU much longer (:meth:`PipeBackend._pace`:
on a small host, the loader's long stretches, not its lock, kept pdns and the query loop
waiting); the collector is paused while a plan loads and the result frozen (a full collection
over a 100,000-member plan held the interpreter for 150 ms); the pools a new table drops are
found and counted by the loader, never at the swap; the last good copy is the text as read, not
the plan serialized again; and the switch interval is 50 us, so a request waits about that for
the loader's Python code.

Bad input never stops the loop: a request that cannot be answered gets ``FAIL`` (with a
``LOG`` line saying why), and end of input is a clean exit.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

from dnslb import __version__
from dnslb.errors import PlanError
from dnslb.plan import Plan
from dnslb.plan_store import FilePlanStore, PlanStore, read_regular_file
from pipe_backend.answers import AnswerTable, CompiledPool, Located, Reply, compile_plan
from pipe_backend.protocol import ABI_VERSIONS, AXFR_FIELDS, END, MAX_LINE, Q_FIELDS, log_fail

log = logging.getLogger("dnslb.pipe_backend")

_READ_SIZE = 65536
_BUSY = 0.0002  # seconds a loader compiles before it rests _REST (only under serve)
_REST = 0.0008
_SWITCH_INTERVAL = 0.00005  # seconds a thread waits for the GIL before asking (Python: 5 ms)
_PROCESS = f"{socket.gethostname()}-{os.getpid()}"


def plan_order(plan: Plan) -> tuple[int, int]:
    """What makes one plan newer than another: the leadership epoch first, then the version."""
    return (plan.epoch, plan.version)


def _label(plan: Plan) -> str:
    """``v7``, or ``epoch 3 v7`` for a plan published by a manager with leadership."""
    return f"epoch {plan.epoch} v{plan.version}" if plan.epoch else f"v{plan.version}"


@dataclass(frozen=True, slots=True)
class _Ready:
    """A plan compiled by the loader, waiting for the query loop to take it."""

    plan: Plan
    stale: bool
    table: AnswerTable | None  # None until the ABI is known (before HELO)
    # The pools of the table in service that this one does not keep (their answer counts are
    # retired at the swap): found by the loader, not by the query loop, for a big plan's sake.
    dropped: tuple[CompiledPool, ...] = ()


_Totals = dict[str, dict[str, tuple[int, int]]]
"""Per pool, pairs of counts by member id (answer counts) or by address family (answers
held)."""


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
        explain: bool = False,
        pause_collector: bool = False,
    ) -> None:
        self.store = store
        # Under serve: the collector paused while plans load (_collector_paused), compiling paced
        # (_pace). Off for a backend driven in the caller's thread (tests).
        self.pause_collector = pause_collector
        self.explain = explain  # answer TXT at _dnslb-explain.<pool> (pipe_backend.explain)
        self.last_good = last_good
        self.rng = rng if rng is not None else random.Random()
        self.poll_interval = poll_interval
        self.stats_interval = stats_interval
        self.monotonic = monotonic
        self.wall = wall
        self.abi: int | None = None
        self.plan: Plan | None = None  # the plan the query loop answers from
        self.stale = False
        self.table: AnswerTable | None = None
        self.requests = 0
        self._names: dict[bytes, dict[bytes, Reply]] = {}
        self._q_fields = 0  # no Q accepted before HELO
        # The loader's side, guarded by _lock (the query loop only ever tries it, never waits).
        self._lock = threading.Lock()
        self._ready: _Ready | None = None
        self._loaded: Plan | None = None  # the newest good plan the loader has
        self._loaded_stale = False
        self._loaded_table: AnswerTable | None = None
        self._stamp: Hashable | None = None
        self._next_poll = float("-inf")
        self._kept: tuple[int, int] | None = None  # plan_order last written to last_good
        self.refused = 0  # plans refused as older than one served before
        self._refused: tuple[int, int] | None = None  # the last refused, logged once
        self._keep_failed = False
        self._problem: str | None = None  # the store's last problem, logged once
        self._failed_version: int | None = None  # a plan that did not compile, logged once
        self._loader_errors = 0
        self._retired_counts: dict[str, dict[str, tuple[int, int]]] = {}
        self._retired_held: dict[str, dict[str, tuple[int, int]]] = {}
        self._retired: list[AnswerTable | Plan | None] = []  # let go of by take(): see _free
        self._dropped: list[tuple[CompiledPool, ...]] = []  # out of service, not yet counted
        self._next_stats = monotonic() + stats_interval
        self._stats_written_at_requests = 0
        self._stats_failed = False
        self._rounds = 0  # loader rounds completed (reload waits for the next one)
        self._round_done = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._force = False
        self._busy_since = 0.0

    # -- plan (the loader's side) ---------------------------------------------------------------

    def poll(self, *, force: bool = False) -> None:
        """One loader round and the take, in the caller's thread (tests; no loader thread)."""
        self.refresh(force=force)
        self.take()

    def refresh(self, *, force: bool = False) -> None:
        """Pick up a new plan and the plan's staleness, and write the answer counts when due;
        cheap unless something changed. Never raises: a failure is logged once and counted."""
        now = self.monotonic()
        if self._retired or self._dropped:
            self._free()
        if now < self._next_poll and not force:
            return
        self._next_poll = now + self.poll_interval
        try:
            self._refresh(force)
        except Exception:  # a bug here must not stop plan loading for good
            self._loader_errors += 1
            if self._loader_errors == 1 or self._loader_errors % 1000 == 0:
                log.exception("plan loading failed (%d times); carrying on", self._loader_errors)
        with self._round_done:
            self._rounds += 1
            self._round_done.notify_all()
        if now >= self._next_stats:
            self._next_stats = now + self.stats_interval
            self.write_stats()

    def _refresh(self, force: bool) -> None:
        try:
            stamp = self.store.stamp()
        except OSError as exc:  # the store is unreachable (Redis down): keep what we have
            self._store_problem(f"is unreachable ({exc})")
        else:
            if stamp != self._stamp or force:
                self._stamp = stamp
                self._load(stamp)
        with self._lock:
            if self._loaded is not None:
                stale = self._loaded.is_stale(self.wall())
                if stale != self._loaded_stale:
                    self._loaded_stale = stale
                    self._log_staleness(self._loaded, stale)
                    self._compile(self._loaded, stale)

    def _load(self, stamp: Hashable | None) -> None:
        self._busy_since = time.perf_counter()
        with self._collector_paused():
            problem = "is missing"
            plan = None
            if stamp is not None:
                try:
                    plan = self.store.read()
                except (PlanError, OSError) as exc:
                    problem = f"not loaded ({exc})"
            if plan is None:
                self._store_problem(problem)
                return
            served = self._loaded if self._loaded is not None else self._last_good_if_other()
            if served is not None and plan_order(plan) < plan_order(served):
                self._refuse(plan, served)
            elif self._install(plan, self.store):
                self._problem = None
                self._refused = None
            else:
                self._store_problem(f"v{plan.version} cannot be compiled")

    def _refuse(self, plan: Plan, served: Plan) -> None:
        """Keep ``served`` (newer than the store's ``plan``); before any plan, serve it."""
        self.refused += 1
        if plan_order(plan) != self._refused:
            self._refused = plan_order(plan)
            log.error(
                "plan %s %s is older than plan %s served before: refused (a manager that "
                "lost its state, or one deposed, publishes it)",
                self.store.describe(),
                _label(plan),
                _label(served),
            )
        if self._loaded is None:  # ``served`` is the last good copy
            self._install(served, self.last_good or self.store)

    @contextlib.contextmanager
    def _collector_paused(self) -> Iterator[None]:
        """With :attr:`pause_collector`: no cyclic garbage collection while a plan loads, and
        what is alive after it moved out of the collector's sight (``gc.freeze``).

        A plan of 100,000 members is millions of objects; every full collection walks all of
        them while holding the interpreter lock, and loading one triggered collections of up to
        150 ms, during which the query loop answered nothing. A plan holds no reference cycles:
        reference counting frees an old one, frozen or not.
        """
        if not self.pause_collector:
            yield
            return
        gc.disable()
        try:
            yield
        finally:
            gc.freeze()
            gc.enable()

    def _store_problem(self, problem: str) -> None:
        """The store's plan cannot be had: serve the last good copy if it is newer than ours."""
        kept = self._read_last_good()
        current = self._loaded.version if self._loaded is not None else None
        if kept is not None and (
            self._loaded is None or plan_order(kept) > plan_order(self._loaded)
        ):
            log.error(
                "plan %s %s; serving the last good plan v%d from %s",
                self.store.describe(),
                problem,
                kept.version,
                self.last_good.describe() if self.last_good else "",
            )
            self._problem = problem
            self._install(kept, self.last_good or self.store)
            return
        if problem != self._problem:
            self._problem = problem
            keeping = f"serving plan v{current}" if current is not None else "no plan to serve yet"
            log.error("plan %s %s; %s", self.store.describe(), problem, keeping)

    def _last_good_if_other(self) -> Plan | None:
        """The last good copy, unless its text is the plan's just read: a coprocess usually
        starts on the plan its copy holds, and parsing a big plan twice delays its first answer."""
        if isinstance(self.last_good, FilePlanStore) and self.store.last_text is not None:
            with contextlib.suppress(OSError):
                kept = read_regular_file(self.last_good.path, self.last_good.max_plan_bytes)
                if kept == self.store.last_text:
                    return None
        return self._read_last_good()

    def _read_last_good(self) -> Plan | None:
        if self.last_good is None:
            return None
        try:
            if self.last_good.stamp() is None:
                return None
            return self.last_good.read()
        except (PlanError, OSError):
            return None

    def _keep(self, plan: Plan) -> None:
        """Write ``plan`` where a coprocess started later finds it if the plan is unreadable."""
        if self.last_good is None or plan_order(plan) == self._kept:
            return
        text = self.store.last_text
        try:
            if isinstance(self.last_good, FilePlanStore) and text is not None:
                self.last_good.publish_text(text, durable=False)  # the plan just read from it
            else:
                self.last_good.publish(plan, durable=False)
            self._kept = plan_order(plan)
        except OSError as exc:
            if not self._keep_failed:
                log.warning(
                    "cannot keep a last good plan at %s: %s", self.last_good.describe(), exc
                )
                self._keep_failed = True

    def _install(self, plan: Plan, source: PlanStore) -> bool:
        """Compile ``plan`` and make it the one to take; False (logged once) if it cannot be."""
        stale = plan.is_stale(self.wall())
        with self._lock:
            if not self._compile(plan, stale):
                return False
            self._loaded = plan
            self._loaded_stale = stale
        log.info(
            "plan %s loaded from %s: %d zones, %d pools%s",
            _label(plan),
            source.describe(),
            len(plan.zones),
            len(plan.pools),
            " (stale)" if stale else "",
        )
        if stale:
            self._log_staleness(plan, stale)
        if source is self.store:
            self._keep(plan)
        return True

    def _compile(self, plan: Plan, stale: bool) -> bool:
        """Compile ``plan`` for the ABI (if known) and post it for the query loop (lock held)."""
        try:
            # Before HELO the ABI is unknown: compile for the newest to know the plan compiles.
            abi = self.abi if self.abi is not None else ABI_VERSIONS[-1]
            self._busy_since = time.perf_counter()
            previous = self._loaded_table  # its pools are keyed by ABI: reused when it matches
            table = compile_plan(
                plan,
                abi,
                stale=stale,
                rng=self.rng,
                previous=previous,
                explain=self.explain,
                pace=self._pace if self.pause_collector else None,
            )
        except Exception:  # a plan the parser let through must never stop the backend
            if plan.version != self._failed_version:
                self._failed_version = plan.version
                log.exception("plan v%d cannot be compiled; keeping the last good", plan.version)
            return False
        dropped: tuple[CompiledPool, ...] = ()
        if previous is not None:
            kept = {id(compiled) for compiled in table.pools.values()}
            dropped = tuple(c for c in previous.pools.values() if id(c) not in kept)
        if self._ready is not None:  # not taken yet: the table in service is older still
            dropped = self._ready.dropped + dropped
        self._loaded_table = table
        self._ready = _Ready(
            plan=plan,
            stale=stale,
            table=table if self.abi is not None else None,
            dropped=dropped,
        )
        return True

    def _pace(self) -> None:
        """Rest ``_REST`` seconds after each ``_BUSY`` seconds of loading: every coprocess of a
        pdns loads a new plan at about the same time, and a loader that held a CPU for
        milliseconds kept pdns's threads and the query loops waiting for one (measured:
        ``docs/pdns.md``, Big plans). Called often (every few hundred microseconds of work),
        so that the rests, not the places to rest, set the rhythm."""
        now = time.perf_counter()
        if now - self._busy_since >= _BUSY:
            time.sleep(_REST)
            self._busy_since = time.perf_counter()

    def _log_staleness(self, plan: Plan, stale: bool) -> None:
        if stale:
            log.warning(
                "plan v%d is older than its stale_after (%.0f s): answering with TTL floors",
                plan.version,
                plan.stale_after or 0.0,
            )
        else:
            log.info("plan v%d is fresh again", plan.version)

    # -- plan (the query loop's side) -----------------------------------------------------------

    def take(self) -> None:
        """Swap in the table the loader finished, if any; never waits for the loader."""
        if self._ready is None or not self._lock.acquire(blocking=False):
            return
        try:
            ready, self._ready = self._ready, None  # set only under the lock, taken only here
            previous = self.table
            # What the swap lets go of is freed by the loader, a piece at a time (_free): freed
            # here, the old table of a plan whose every pool changed held the query loop for
            # milliseconds (5 ms at 10,000 members), in one piece.
            self._retired.append(self.plan)
            self.plan = ready.plan
            self.stale = ready.stale
            if ready.table is not None:
                self.table = ready.table
                self._names = ready.table.names
                self._retired.append(previous)
                if previous is not None:
                    # Out of service from here: their counts are final, and added up by the
                    # loader (_free); summed here, 10 changed pools held the loop for 2-4 ms.
                    self._dropped.append(ready.dropped)
        finally:
            self._lock.release()

    def _free(self) -> None:
        """Count and free what the query loop let go of (:meth:`take`) on the loader's thread,
        a pool at a time, resting between pieces as compiling does."""
        pace = self._loader_pace()
        with self._lock:
            retired, self._retired = self._retired, []
            dropped = self._dropped[:]  # listed until counted: answer_counts adds them meanwhile
        counts = []
        for pools in dropped:
            for compiled in pools:
                counts.append((compiled.name, compiled.answer_counts(), compiled.answers_held()))
                pace()
        with self._lock:
            for name, pool_counts, held in counts:
                _add_counts(self._retired_counts.setdefault(name, {}), pool_counts)
                _add_counts(self._retired_held.setdefault(name, {}), held)
            del self._dropped[: len(dropped)]  # only take() appends, and only at the end
        while retired:
            item = retired.pop()
            if isinstance(item, AnswerTable):
                item.names.clear()  # the pools' replies live on in item.pools
                while item.pools:
                    item.pools.popitem()
                    pace()
            elif isinstance(item, Plan):
                plan_pools = list(item.pools)
                del item
                while plan_pools:
                    plan_pools.pop()
                    pace()

    def _loader_pace(self) -> Callable[[], None]:
        """The loader's :meth:`_pace` under serve; elsewhere (tests) no rest."""
        return self._pace if self.pause_collector else _no_pace

    def answer_counts(
        self, pace: Callable[[], None] | None = None
    ) -> dict[str, dict[str, tuple[int, int]]]:
        """Per pool and member: (answers it came first in, answers it was in), since start;
        ``pace`` is called after each pool (the loader's :meth:`_pace`, from write_stats)."""
        return self._totals(pace)[0]

    def answers_held(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Per pool and address family (``A``, ``AAAA``): (answers with addresses given, the
        seconds they were held for, their TTLs added up), since start."""
        return self._totals(None)[1]

    def _totals(self, pace: Callable[[], None] | None) -> tuple[_Totals, _Totals]:
        with self._lock:
            counts = {pool: dict(members) for pool, members in self._retired_counts.items()}
            held = {pool: dict(types) for pool, types in self._retired_held.items()}
            pools = [compiled for dropped in self._dropped for compiled in dropped]
            if self.table is not None:
                pools += self.table.pools.values()
        for compiled in pools:
            _add_counts(counts.setdefault(compiled.name, {}), compiled.answer_counts())
            _add_counts(held.setdefault(compiled.name, {}), compiled.answers_held())
            if pace is not None:
                pace()
        return counts, held

    def write_stats(self) -> None:
        """Publish the answer counts beside the plan, for the manager's metrics."""
        requests = self.requests
        if requests == self._stats_written_at_requests:
            return
        plan = self.plan
        counts, held = self._totals(self._loader_pace())
        document = {
            "process": _PROCESS,
            "written_at": self.wall(),
            "plan_version": plan.version if plan else None,
            "plan_epoch": plan.epoch if plan else None,
            "plans_refused": self.refused,
            "requests": requests,
            "pools": {
                pool: {member: list(pair) for member, pair in members.items()}
                for pool, members in counts.items()
            },
            # how many resolvers hold a pool's answers: the manager's k follows it
            "held": {
                pool: {family: list(pair) for family, pair in families.items()}
                for pool, families in held.items()
                if any(given for given, _ in families.values())
            },
        }
        try:
            self.store.write_stats(_PROCESS, document)
        except OSError as exc:
            if not self._stats_failed:
                log.warning("cannot write answer counts beside %s: %s", self.store.describe(), exc)
                self._stats_failed = True
            return
        self._stats_written_at_requests = requests

    # -- the loader thread ----------------------------------------------------------------------

    def start_loader(self) -> threading.Event:
        """Run :meth:`refresh` in a daemon thread until the returned event is set."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                force, self._force = self._force, False
                self.refresh(force=force)
                self._wake.wait(self.poll_interval)
                self._wake.clear()

        self._loader_thread = threading.Thread(target=loop, name="plan-loader", daemon=True)
        self._loader_thread.start()
        return stop

    def _reload(self, timeout: float = 2.0) -> bool:
        """Have the loader re-read the plan now; wait up to ``timeout`` for it, then take it."""
        thread = getattr(self, "_loader_thread", None)
        if thread is None or not thread.is_alive():
            self.poll(force=True)
            return True
        with self._round_done:
            target = self._rounds + 2  # a round that started after this request
            self._force = True
            self._wake.set()
            done = self._round_done.wait_for(lambda: self._rounds >= target, timeout)
        self.take()
        return done

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
            if reply.__class__ is Located:
                # ABI 3+: the client subnet, or the resolver's address as /32 or /128 without ECS
                subnet = parts[7]
                ecs = subnet.partition(b"/")[0] != parts[5]
                return reply.reply(qname, subnet, ecs)
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
        with self._lock:  # once per process: compile what the loader has for this ABI
            if self._loaded is not None and not self._compile(self._loaded, self._loaded_stale):
                self._ready = None
        self.take()
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
            done = self._reload()
            lines = ["reloaded" if done else "reload asked; the plan store is slow", *self.status()]
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
            lines.append(f"plan epoch: {self.plan.epoch}")
            lines.append("plan age: " + ("unknown" if age is None else f"{age:.1f} s"))
            lines.append(f"plan stale: {'yes' if self.stale else 'no'}")
            lines.append(f"plan source: {self.store.describe()}")
            lines.append(f"zones: {len(self.plan.zones)}, pools: {len(self.plan.pools)}")
        lines.append(f"plans refused as older than one served: {self.refused}")
        lines.append(f"requests answered: {self.requests}")
        return lines

    # -- the loop -------------------------------------------------------------------------------

    def serve(self, fd_in: int, fd_out: int) -> None:
        """Answer requests from ``fd_in`` on ``fd_out`` until end of input.

        The coprocess's own loop: it also pauses the garbage collector while plans load
        (:attr:`pause_collector`) and shortens the interpreter's switch interval, so that a
        request arriving while the loader computes waits about 50 us for the interpreter
        lock instead of 5 ms. Both are undone when it returns (tests serve in
        their own process)."""
        paused, self.pause_collector = self.pause_collector, True
        self.store.pool_cache.pace = self._pace  # reading a plan is paced as compiling it is
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(_SWITCH_INTERVAL)
        stop = self.start_loader()
        try:
            self._serve(fd_in, fd_out)
        finally:
            stop.set()
            self._wake.set()
            self.write_stats()  # the last counts of this coprocess
            self.pause_collector = paused
            self.store.pool_cache.pace = None
            sys.setswitchinterval(switch_interval)
            gc.unfreeze()

    def _serve(self, fd_in: int, fd_out: int) -> None:
        handle = self.handle
        pending = b""
        discarding = False  # inside a line that was too long: drop it up to its newline
        while True:
            chunk = os.read(fd_in, _READ_SIZE)
            if not chunk:
                if pending and not discarding:
                    _write_all(fd_out, self._answer([pending.rstrip(b"\r")]))
                    self.requests += 1
                return
            if self._ready is not None:
                self.take()
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if discarding and lines:
                lines.pop(0)
                discarding = False
            try:
                replies = [handle(line) if len(line) <= MAX_LINE else _TOO_LONG for line in lines]
            except Exception:  # a bug must cost one request a FAIL, never the coprocess
                replies = [self._answer([line]) for line in lines]
            if len(pending) > MAX_LINE:
                if not discarding:
                    replies.append(_TOO_LONG)
                discarding = True
                pending = b""
            self.requests += len(replies)
            if replies:
                _write_all(fd_out, b"".join(replies))

    def _answer(self, lines: list[bytes]) -> bytes:
        """Replies to ``lines`` one by one, a failure in one a ``FAIL`` for it alone."""
        replies = []
        for line in lines:
            if len(line) > MAX_LINE:
                replies.append(_TOO_LONG)
                continue
            try:
                replies.append(self.handle(line))
            except Exception:
                log.exception("request %r failed", line[:80])
                replies.append(log_fail("dnslb: internal error answering this request"))
        return b"".join(replies)


def _add_counts(totals: dict[str, tuple[int, int]], counts: dict[str, tuple[int, int]]) -> None:
    """Add a pool's pairs of ``counts`` (per member: first, seen; per address family: given,
    held) into ``totals``."""
    for member, (first, seen) in counts.items():
        old_first, old_seen = totals.get(member, (0, 0))
        totals[member] = (old_first + first, old_seen + seen)


def _no_pace() -> None:
    pass


_TOO_LONG = log_fail(f"dnslb: request longer than {MAX_LINE} bytes")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
