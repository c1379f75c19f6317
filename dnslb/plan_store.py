"""Where plans are published and read: a small base class, its implementations (a file on one
host, Redis for several), and :func:`open_store` to pick one from a location string.

The manager calls :meth:`PlanStore.publish`; every pipe backend polls :meth:`PlanStore.stamp`
(cheap: a ``stat`` of a file, or one small key) and calls :meth:`PlanStore.read` only when the
stamp changed. Publishing is atomic: a reader sees the old plan or the new one, never a mix.

Only the standard library is used here: the pipe backend imports this module.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from dnslb.errors import ConfigError
from dnslb.plan import Plan, parse_plan_json, plan_to_json
from dnslb.resp import RedisAddress, RedisConnection, RedisError


class PlanStore(ABC):
    """A place plans are published to and read from."""

    @abstractmethod
    def describe(self) -> str:
        """Where the plan lives, for logs and status lines."""

    def close(self) -> None:  # noqa: B027 - an optional hook: files hold nothing open
        """Release connections."""

    @abstractmethod
    def publish(self, plan: Plan, *, durable: bool = True) -> None:
        """Make ``plan`` the current plan, atomically (and on stable storage if ``durable``)."""

    @abstractmethod
    def stamp(self) -> Hashable | None:
        """A cheap value that changes whenever the published plan changes; None if there is none."""

    @abstractmethod
    def read(self) -> Plan:
        """The current plan; raises :class:`~dnslb.errors.PlanError` or ``OSError``."""

    @abstractmethod
    def write_stats(self, name: str, document: dict[str, Any]) -> None:
        """Publish a reader's statistics (the answers a pipe backend gave) under ``name``."""

    @abstractmethod
    def read_stats(self, max_age: float = 86400.0) -> list[dict[str, Any]]:
        """Every reader's statistics written within ``max_age`` seconds (older ones are dropped)."""


class FilePlanStore(PlanStore):
    """A plan in a JSON file, replaced by write + fsync + rename."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def describe(self) -> str:
        return str(self.path)

    def publish(self, plan: Plan, *, durable: bool = True) -> None:
        text = plan_to_json(plan).encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(text)
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
            os.chmod(temp, 0o644)
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def stamp(self) -> Hashable | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_ino, info.st_mtime_ns, info.st_size)

    def read(self) -> Plan:
        return parse_plan_json(self.path.read_bytes())

    @property
    def stats_dir(self) -> Path:
        return self.path.with_name(f".{self.path.name}.stats")

    def write_stats(self, name: str, document: dict[str, Any]) -> None:
        self.stats_dir.mkdir(exist_ok=True)
        target = self.stats_dir / f"{name}.json"
        temp = target.with_name(f".{target.name}.tmp")
        temp.write_text(json.dumps(document, separators=(",", ":")))
        os.replace(temp, target)

    def read_stats(self, max_age: float = 86400.0) -> list[dict[str, Any]]:
        documents = []
        now = time.time()
        try:
            entries = list(self.stats_dir.glob("*.json"))
        except OSError:
            return []
        for path in entries:
            try:
                if now - path.stat().st_mtime > max_age:
                    path.unlink(missing_ok=True)  # a coprocess long gone
                    continue
                document = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # vanished or half-written: the next read will have it
            if isinstance(document, dict):
                documents.append(document)
        return documents


class RedisPlanStore(PlanStore):
    """A plan in Redis, for several DNS servers on several hosts: one key holds the plan, a
    second its stamp (version and generation time); both are set in one MULTI/EXEC, so a
    reader that sees a new stamp finds the plan that goes with it. Answer counts go to a hash.
    """

    def __init__(self, address: RedisAddress, timeout: float = 0.5) -> None:
        self.address = address
        self.connection = RedisConnection(address, timeout)
        self.stamp_key = f"{address.key}:stamp"
        self.stats_key = f"{address.key}:stats"

    def describe(self) -> str:
        return self.address.describe()

    def close(self) -> None:
        self.connection.close()

    def publish(self, plan: Plan, *, durable: bool = True) -> None:
        text = plan_to_json(plan)
        stamp = f"{plan.version}:{plan.generated_at}"
        replies = self.connection.pipeline(
            [
                ("MULTI",),
                ("SET", self.address.key, text),
                ("SET", self.stamp_key, stamp),
                ("EXEC",),
            ]
        )
        if not isinstance(replies[-1], list):
            raise RedisError(f"{self.describe()}: the plan was not stored ({replies[-1]!r})")

    def stamp(self) -> Hashable | None:
        value = self.connection.command("GET", self.stamp_key)
        return value if isinstance(value, bytes) else None

    def read(self) -> Plan:
        value = self.connection.command("GET", self.address.key)
        if not isinstance(value, bytes):
            raise FileNotFoundError(f"{self.describe()}: no plan")
        return parse_plan_json(value)

    def write_stats(self, name: str, document: dict[str, Any]) -> None:
        self.connection.command(
            "HSET", self.stats_key, name, json.dumps(document, separators=(",", ":"))
        )

    def read_stats(self, max_age: float = 86400.0) -> list[dict[str, Any]]:
        try:
            reply = self.connection.command("HGETALL", self.stats_key)
        except OSError:
            return []
        if not isinstance(reply, list):
            return []
        documents = []
        now = time.time()
        for name, raw in zip(reply[::2], reply[1::2], strict=True):
            try:
                document = json.loads(raw) if isinstance(raw, bytes) else None
            except ValueError:
                document = None
            if not isinstance(document, dict):
                continue
            written = document.get("written_at")
            if (
                isinstance(written, int | float)
                and now - written > max_age
                and isinstance(name, bytes)
            ):
                self.connection.command("HDEL", self.stats_key, name)  # a coprocess long gone
                continue
            documents.append(document)
        return documents


def open_store(location: str, *, password: str | None = None) -> PlanStore:
    """The store at ``location``: a file path, a ``file://`` URL, or a ``redis://`` URL (the
    password from ``password``, or from the environment variable ``DNSLB_REDIS_PASSWORD``)."""
    if location.startswith("file://"):
        return FilePlanStore(location.removeprefix("file://"))
    if location.startswith("redis://"):
        try:
            address = RedisAddress.parse(
                location, password=password or os.environ.get("DNSLB_REDIS_PASSWORD")
            )
        except ValueError as exc:
            raise ConfigError("plan location", [str(exc)]) from None
        return RedisPlanStore(address)
    if "://" in location:
        scheme = location.split("://", 1)[0]
        raise ConfigError("plan location", [f"{location}: unsupported plan store {scheme!r}"])
    return FilePlanStore(location)


def last_good_store(store: PlanStore) -> PlanStore | None:
    """Where a reader of ``store`` keeps its last good plan: beside a plan file, else nowhere.

    A pipe backend that PowerDNS starts while the plan is unreadable (hand-edited, half-written)
    serves this copy instead of nothing.
    """
    if isinstance(store, FilePlanStore):
        return FilePlanStore(store.path.with_name(f".{store.path.name}.last-good"))
    return None
