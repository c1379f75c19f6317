"""Where plans are published and read: a small base class, its implementations, and
:func:`open_store` to pick one from a location string.

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


class PlanStore(ABC):
    """A place plans are published to and read from."""

    @abstractmethod
    def describe(self) -> str:
        """Where the plan lives, for logs and status lines."""

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


def open_store(location: str) -> PlanStore:
    """The store at ``location``: a file path, or a ``file://`` URL."""
    if location.startswith("file://"):
        return FilePlanStore(location.removeprefix("file://"))
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
