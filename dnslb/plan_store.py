"""Where plans are published and read: a small base class, its implementations (a file on one
host, Redis for several), and :func:`open_store` to pick one from a location string, by its
URL scheme (:data:`STORES`).

The manager calls :meth:`PlanStore.publish`; every pipe backend polls :meth:`PlanStore.stamp`
(cheap: a ``stat`` of a file, or one small key) and calls :meth:`PlanStore.read` only when the
stamp changed. Publishing is atomic: a reader sees the old plan or the new one, never a mix.

The way back, from the pipe backends to the manager, is their answer counts: each writes its
statistics document to the store (:meth:`PlanStore.write_stats`: a file in the directory
``.NAME.stats`` beside a plan file ``NAME``, or a field of the hash ``KEY:stats`` beside a Redis
key) and the manager sums them (:meth:`PlanStore.read_stats`). The manager opens that channel
(:meth:`PlanStore.open_stats`, creating the directory); a pipe backend never creates it, so that
one serving a plan written by hand leaves nothing beside it. A pipe backend's own files (its
last good plan) go to its state directory (:func:`last_good_store`), never beside the plan.

What a store holds is read as hostile input: reading never hangs and never takes more memory
than its limit. A plan is at most ``max_plan_bytes`` (:data:`MAX_PLAN_BYTES` by default, the
writer refuses to publish a larger one); a file store reads only a regular file (a FIFO, a
device or a directory at the plan's path is refused without blocking); the Redis store reads
the stamp with a short deadline and the plan with a longer one (:mod:`dnslb.resp` bounds every
reply). Statistics documents are skipped, never raised, when they are not what a pipe backend
writes: not a regular file, too large, not JSON, nested too deep, not an object, or (in Redis,
where no file time tells) without a finite ``written_at``.

Only the standard library is used here: the pipe backend imports this module.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import stat
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnslb.errors import ConfigError
from dnslb.plan import Plan, PlanEncoder, PoolCache, parse_plan_json
from dnslb.resp import (
    SMALL_LIMITS,
    RedisAddress,
    RedisConnection,
    RedisError,
    RespLimits,
    redact_url,
)

MAX_PLAN_BYTES = 64 * 1024 * 1024
"""The largest plan a store reads or publishes by default (a plan of 100,000 members is tens
of MB of JSON)."""
MAX_STATS_BYTES = 16 * 1024 * 1024
"""The largest statistics document read (one pipe backend's answer counts)."""
MAX_STATS_DOCUMENTS = 10_000
"""The most statistics documents read at once (one per pipe backend seen within max_age)."""


class PlanStore(ABC):
    """A place plans are published to and read from."""

    max_plan_bytes: int = MAX_PLAN_BYTES
    """The largest plan text read or published: a larger one is refused by both sides."""
    last_text: bytes | None = None
    """The text of the plan the last :meth:`read` returned (None before one): a reader keeping
    a copy writes it as read instead of serializing the plan again."""

    @abstractmethod
    def describe(self) -> str:
        """Where the plan lives, for logs and status lines."""

    def close(self) -> None:  # noqa: B027 - an optional hook: files hold nothing open
        """Release connections."""

    @abstractmethod
    def publish(self, plan: Plan, *, durable: bool = True) -> None:
        """Make ``plan`` the current plan, atomically (and on stable storage if ``durable``).
        Raises ``OSError`` (``EFBIG`` for a plan larger than ``max_plan_bytes``)."""

    @abstractmethod
    def stamp(self) -> Hashable | None:
        """A cheap value that changes whenever the published plan changes; None if there is none."""

    @abstractmethod
    def read(self) -> Plan:
        """The current plan; raises :class:`~dnslb.errors.PlanError` or ``OSError``. Pools whose
        JSON text is unchanged since the last read are not validated again (:attr:`pool_cache`)."""

    @property
    def pool_cache(self) -> PoolCache:
        """The pools of the last plan read, by their exact text (one reader thread at a time)."""
        cache: PoolCache | None = getattr(self, "_pool_cache", None)
        if cache is None:
            cache = self._pool_cache = PoolCache()
        return cache

    def open_stats(self) -> None:  # noqa: B027 - an optional hook: Redis needs nothing
        """Make the store ready for :meth:`write_stats` (the manager, their reader, calls it).
        Raises ``OSError``."""

    @abstractmethod
    def write_stats(self, name: str, document: dict[str, Any]) -> None:
        """Publish a reader's statistics (the answers a pipe backend gave) under ``name``;
        nothing when no reader opened the channel (:meth:`open_stats`). Raises ``OSError``."""

    @abstractmethod
    def read_stats(self, max_age: float = 86400.0) -> list[dict[str, Any]]:
        """Every reader's statistics written within ``max_age`` seconds (older ones are dropped).
        Never raises: an unreadable store gives ``[]``, an unreadable document is skipped. The
        documents are JSON objects and nothing more is checked: the caller validates them."""

    def encode(self, plan: Plan) -> bytes:
        """``plan``'s text as published; the last one is kept, so that a writer that checks
        the text before it publishes (the manager) serializes each plan once."""
        kept: tuple[Plan, bytes] | None = getattr(self, "_encoded", None)
        if kept is not None and kept[0] is plan:
            return kept[1]
        encoder: PlanEncoder | None = getattr(self, "_encoder", None)
        if encoder is None:
            encoder = self._encoder = PlanEncoder()
        text = encoder.encode(plan).encode("utf-8")
        self._encoded = (plan, text)
        return text

    def _plan_text(self, plan: Plan) -> bytes:
        text = self.encode(plan)
        if len(text) > self.max_plan_bytes:
            raise OSError(
                errno.EFBIG,
                f"plan v{plan.version} is {len(text)} bytes, more than readers accept "
                f"({self.max_plan_bytes})",
                self.describe(),
            )
        return text


class FilePlanStore(PlanStore):
    """A plan in a JSON file, replaced by write + fsync + rename.

    The file is written 0644 (readers may run as another user), through a fresh temporary
    name (never a name an existing file or symlink holds). Reading refuses anything but a
    regular file of at most ``max_plan_bytes``, without blocking on a FIFO.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_plan_bytes: int = MAX_PLAN_BYTES
    ) -> None:
        self.path = Path(path)
        self.max_plan_bytes = max_plan_bytes

    def describe(self) -> str:
        return str(self.path)

    def publish(self, plan: Plan, *, durable: bool = True) -> None:
        text = self._plan_text(plan)
        _write_file(self.path, text, durable=durable)

    def publish_text(self, text: bytes, *, durable: bool = True) -> None:
        """Make ``text``, a plan's text as a store's :meth:`read` accepted it, the current plan
        (a copy kept without the cost of serializing a big plan again). Raises ``OSError``."""
        if len(text) > self.max_plan_bytes:
            raise OSError(errno.EFBIG, f"the plan is {len(text)} bytes", self.describe())
        _write_file(self.path, text, durable=durable)

    def stamp(self) -> Hashable | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_ino, info.st_mtime_ns, info.st_size)

    def read(self) -> Plan:
        text = read_regular_file(self.path, self.max_plan_bytes)
        plan = parse_plan_json(text, cache=self.pool_cache)
        self.last_text = text
        return plan

    @property
    def stats_dir(self) -> Path:
        """Where pipe backends write their answer counts: ``.NAME.stats/`` beside the plan.
        PowerDNS's user must be able to write in it (the plan's directory need not be)."""
        return self.path.with_name(f".{self.path.name}.stats")

    def open_stats(self) -> None:
        self.stats_dir.mkdir(exist_ok=True)

    def write_stats(self, name: str, document: dict[str, Any]) -> None:
        if not self.stats_dir.is_dir():
            return  # no manager reads this plan (written by hand): leave nothing beside it
        text = json.dumps(document, separators=(",", ":")).encode("utf-8")
        _write_file(self.stats_dir / f"{name}.json", text, durable=False)

    def read_stats(self, max_age: float = 86400.0) -> list[dict[str, Any]]:
        documents = []
        now = time.time()
        budget = max(self.max_plan_bytes, MAX_STATS_BYTES)  # bytes read in all
        try:
            with os.scandir(self.stats_dir) as entries:
                names = [
                    entry.name
                    for entry, _ in zip(entries, range(MAX_STATS_DOCUMENTS), strict=False)
                    if entry.name.endswith(".json") and not entry.name.startswith(".")
                ]
        except OSError:
            return []
        for name in names:
            if budget <= 0:
                break
            path = self.stats_dir / name
            try:
                info = os.stat(path)
                if not stat.S_ISREG(info.st_mode) or info.st_size > min(budget, MAX_STATS_BYTES):
                    continue
                if now - info.st_mtime > max_age:
                    path.unlink(missing_ok=True)  # a coprocess long gone
                    continue
                raw = read_regular_file(path, min(budget, MAX_STATS_BYTES))
            except OSError:
                continue  # vanished, or not a file a pipe backend writes
            budget -= len(raw)
            document = _stats_document(raw)
            if document is not None:
                documents.append(document)
        return documents


class MemoryPlanStore(PlanStore):
    """A plan kept in this process, as text: what a file or Redis would hold, read through the
    same parser (the simulator's manager publishes here and its pipe backend reads from here).
    Statistics documents are kept by name, with the time they were written (``clock``)."""

    def __init__(
        self, *, max_plan_bytes: int = MAX_PLAN_BYTES, clock: Callable[[], float] = time.time
    ) -> None:
        self.max_plan_bytes = max_plan_bytes
        self.clock = clock
        self.text: bytes | None = None
        self.publications = 0
        self.stats: dict[str, tuple[float, dict[str, Any]]] | None = None  # None: not opened
        self.failing = False  # an outage: every call fails as an unreachable store's does

    def describe(self) -> str:
        return "memory"

    def _check(self) -> None:
        if self.failing:
            raise OSError(errno.ECONNREFUSED, "the store is down (an outage)", self.describe())

    def publish(self, plan: Plan, *, durable: bool = True) -> None:
        self._check()
        self.text = self._plan_text(plan)
        self.publications += 1

    def stamp(self) -> Hashable | None:
        self._check()
        return self.publications if self.text is not None else None

    def read(self) -> Plan:
        self._check()
        if self.text is None:
            raise OSError(errno.ENOENT, "no plan published", self.describe())
        plan = parse_plan_json(self.text, cache=self.pool_cache)
        self.last_text = self.text
        return plan

    def open_stats(self) -> None:
        if self.stats is None:
            self.stats = {}

    def write_stats(self, name: str, document: dict[str, Any]) -> None:
        if self.stats is not None:
            self.stats[name] = (self.clock(), json.loads(json.dumps(document)))

    def read_stats(self, max_age: float = 86400.0) -> list[dict[str, Any]]:
        now = self.clock()
        return [doc for at, doc in (self.stats or {}).values() if now - at <= max_age]


def read_regular_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed), at most ``limit`` of them.

    Never blocks and never reads more than ``limit + 1`` bytes: a FIFO, a device, a socket or
    a directory is refused before it is read (``EINVAL``), a larger file with ``EFBIG``.
    """
    _check_regular(os.stat(path), path)  # refused before open(): opening a device can act
    # O_NONBLOCK: if a FIFO is put there between stat and open, opening it does not wait for
    # a writer (and fstat refuses it).
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        _check_regular(info, path)
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        chunks = []
        total = 0
        while total <= limit:  # the file may grow after fstat: read at most limit + 1
            chunk = os.read(fd, min(limit + 1 - total, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _check_regular(info: os.stat_result, path: str | os.PathLike[str]) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = {
            stat.S_IFIFO: "a FIFO",
            stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device",
            stat.S_IFDIR: "a directory",
            stat.S_IFSOCK: "a socket",
        }.get(stat.S_IFMT(info.st_mode), "not a file")
        raise OSError(errno.EINVAL, f"not a regular file ({kind})", str(path))


def _write_file(path: Path, text: bytes, *, durable: bool) -> None:
    """Replace ``path`` with ``text`` atomically, mode 0644, through a fresh temporary file:
    mkstemp creates it (O_EXCL, so never through a symlink planted at its name) and the mode
    is set on the open file, not by name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            if durable:
                os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _stats_document(raw: object) -> dict[str, Any] | None:
    """A statistics document, or None when ``raw`` is not a JSON object of a sane size."""
    if not isinstance(raw, bytes) or len(raw) > MAX_STATS_BYTES:
        return None
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON (or not UTF-8), or nested too deep
        return None
    return document if isinstance(document, dict) else None


def _age(written: object, now: float) -> float | None:
    """Seconds since ``written`` (a document's ``written_at``), None unless a finite number."""
    if isinstance(written, bool) or not isinstance(written, int | float):
        return None
    try:
        age = now - float(written)
    except OverflowError:  # an integer beyond any float
        return None
    return age if math.isfinite(age) else None


class RedisPlanStore(PlanStore):
    """A plan in Redis, for several DNS servers on several hosts: one key holds the plan, a
    second its stamp (version and generation time); both are set in one MULTI/EXEC, so a
    reader that sees a new stamp finds the plan that goes with it. Answer counts go to a hash.

    The stamp is read within ``timeout`` seconds and a small reply; the plan and the answer
    counts within ``bulk_timeout`` and at most ``max_plan_bytes`` (the stamp is what a pipe
    backend polls; the plan is read only when the stamp changed).
    """

    def __init__(
        self,
        address: RedisAddress,
        timeout: float = 0.5,
        *,
        bulk_timeout: float = 5.0,
        max_plan_bytes: int = MAX_PLAN_BYTES,
        connection: RedisConnection | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.bulk_timeout = bulk_timeout
        self.max_plan_bytes = max_plan_bytes
        self.connection = connection or RedisConnection(address, timeout)
        self.stamp_key = f"{address.key}:stamp"
        self.stats_key = f"{address.key}:stats"
        # GET of the plan: one bulk string (its header line is short).
        self.plan_limits = RespLimits(
            max_line=4096, max_bytes=max_plan_bytes + 64, max_elements=0, max_depth=0
        )
        # HGETALL of the answer counts: name, document, name, document...
        self.stats_limits = RespLimits(
            max_line=4096,
            max_bytes=max(max_plan_bytes, MAX_STATS_BYTES),
            max_elements=2 * MAX_STATS_DOCUMENTS,
            max_depth=1,
        )

    def describe(self) -> str:
        return self.address.describe()

    def close(self) -> None:
        self.connection.close()

    def publish(self, plan: Plan, *, durable: bool = True) -> None:
        text = self._plan_text(plan)
        stamp = f"{plan.epoch}:{plan.version}:{plan.generated_at}"
        replies = self.connection.pipeline(
            [
                ("MULTI",),
                ("SET", self.address.key, text),
                ("SET", self.stamp_key, stamp),
                ("EXEC",),
            ],
            deadline=self.bulk_timeout,
            limits=SMALL_LIMITS,
        )
        if not isinstance(replies[-1], list):
            raise RedisError(f"{self.describe()}: the plan was not stored ({replies[-1]!r})")

    def stamp(self) -> Hashable | None:
        value = self.connection.command("GET", self.stamp_key, limits=SMALL_LIMITS)
        return value if isinstance(value, bytes) else None

    def read(self) -> Plan:
        value = self.connection.command(
            "GET", self.address.key, deadline=self.bulk_timeout, limits=self.plan_limits
        )
        if value is None:
            raise FileNotFoundError(f"{self.describe()}: no plan")
        if not isinstance(value, bytes):
            raise RedisError(f"{self.describe()}: GET answered {type(value).__name__}, not text")
        plan = parse_plan_json(value, cache=self.pool_cache)
        self.last_text = value
        return plan

    def write_stats(self, name: str, document: dict[str, Any]) -> None:
        self.connection.command(
            "HSET",
            self.stats_key,
            name,
            json.dumps(document, separators=(",", ":")),
            deadline=self.bulk_timeout,
            limits=SMALL_LIMITS,
        )

    def read_stats(self, max_age: float = 86400.0) -> list[dict[str, Any]]:
        try:
            reply = self.connection.command(
                "HGETALL", self.stats_key, deadline=self.bulk_timeout, limits=self.stats_limits
            )
        except OSError:
            return []
        if not isinstance(reply, list):
            return []
        documents = []
        gone: list[bytes] = []
        now = time.time()
        for index in range(0, len(reply) - 1, 2):  # an odd last element is ignored
            name, document = reply[index], _stats_document(reply[index + 1])
            if document is None:
                continue
            age = _age(document.get("written_at"), now)
            if age is None:
                continue  # not written by a pipe backend: no way to tell its age
            if age > max_age:
                if isinstance(name, bytes):
                    gone.append(name)  # a coprocess long gone
                continue
            documents.append(document)
        if gone:
            with contextlib.suppress(OSError):  # else removed on a later read
                self.connection.command("HDEL", self.stats_key, *gone, limits=SMALL_LIMITS)
        return documents


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """What :func:`open_store` passes to every store's opener besides the location."""

    password: str | None = None
    max_plan_bytes: int = MAX_PLAN_BYTES


def _open_file(location: str, options: StoreOptions) -> PlanStore:
    return FilePlanStore(location.removeprefix("file://"), max_plan_bytes=options.max_plan_bytes)


def _open_redis(location: str, options: StoreOptions) -> PlanStore:
    try:
        address = RedisAddress.parse(
            location, password=options.password or os.environ.get("DNSLB_REDIS_PASSWORD")
        )
    except ValueError as exc:
        raise ConfigError("plan location", [str(exc)]) from None
    return RedisPlanStore(address, max_plan_bytes=options.max_plan_bytes)


STORES: dict[str, Callable[[str, StoreOptions], PlanStore]] = {
    "file": _open_file,
    "redis": _open_redis,
}
"""The registry of plan stores: the opener of each URL scheme, given the whole location (a
location without a scheme is a file path). A new store is its class and one line here."""


def open_store(
    location: str, *, password: str | None = None, max_plan_bytes: int = MAX_PLAN_BYTES
) -> PlanStore:
    """The store at ``location``: a file path, or a URL whose scheme :data:`STORES` names
    (``file://``, or ``redis://`` with the password from ``password`` or from the environment
    variable ``DNSLB_REDIS_PASSWORD``); :class:`ConfigError` for another scheme, with the known
    ones (and never the location's password)."""
    options = StoreOptions(password=password, max_plan_bytes=max_plan_bytes)
    scheme, is_url, _ = location.partition("://")
    if not is_url:
        return _open_file(location, options)
    opener = STORES.get(scheme)
    if opener is None:
        known = ", ".join(sorted(STORES))
        raise ConfigError(
            "plan location",
            [f"{redact_url(location)}: unsupported plan store {scheme!r} (known: {known})"],
        )
    return opener(location, options)


def last_good_store(store: PlanStore, state_dir: str | os.PathLike[str]) -> FilePlanStore:
    """Where a reader of ``store`` keeps its last good plan: a file in ``state_dir`` named after
    the store's location (``last-good-`` and 16 hex digits of its SHA-256), so that every pipe
    backend of one plan shares it and pipe backends of different plans never do.

    A pipe backend that PowerDNS starts while the plan is unreadable (hand-edited, half-written,
    Redis down) serves this copy instead of nothing.
    """
    where = str(store.path.resolve()) if isinstance(store, FilePlanStore) else store.describe()
    digest = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return FilePlanStore(
        Path(state_dir) / f"last-good-{digest}.json", max_plan_bytes=store.max_plan_bytes
    )
