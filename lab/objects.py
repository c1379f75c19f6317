"""The objects a lab serves: ``/objects/0`` .. ``/objects/N-1``, each with a fixed size.

Sizes follow an exponential distribution above ``min_size`` (by quantiles, so that every run and
every process sees the same sizes): a cache server whose sending is paced (nginx ``limit_rate``
in writes of ``min_size`` bytes, :mod:`daemons.nginx`) then spends an exponentially distributed
time on a request, as the paper's servers and the simulator's do.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from dnslb.config import setting

PREFIX = "/objects/"


@dataclass(frozen=True, slots=True)
class ObjectCatalog:
    """``count`` objects of mean size ``mean_size`` bytes, none smaller than ``min_size``."""

    count: int = setting(100, help="number of distinct objects", min=1, max=1_000_000)
    mean_size: int = setting(10240, help="mean object size, bytes", min=1)
    min_size: int = setting(2048, help="smallest object size, bytes", min=1)

    def config_problems(self) -> Iterator[str]:
        if self.min_size > self.mean_size:
            yield f"min_size ({self.min_size}) must not exceed mean_size ({self.mean_size})"

    def size(self, index: int) -> int:
        """The size of object ``index`` (0 <= index < count), bytes."""
        if not 0 <= index < self.count:
            raise IndexError(f"object {index} is not in 0..{self.count - 1}")
        quantile = (index + 0.5) / self.count
        extra = (self.mean_size - self.min_size) * -math.log(1.0 - quantile)
        return self.min_size + round(extra)

    def path(self, index: int) -> str:
        return f"{PREFIX}{index}"

    def index_of(self, path: str) -> int | None:
        """The object a request path names, or None (query strings are ignored)."""
        path = path.split("?", 1)[0]
        if not path.startswith(PREFIX):
            return None
        tail = path[len(PREFIX) :]
        if not tail.isdigit() or len(tail) > 9:
            return None
        index = int(tail)
        return index if index < self.count else None
