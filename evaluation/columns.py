"""What a run measured: the paper's columns and ours, and the tables that show them.

The paper (its tables 1-4) reports per case: cost in server-seconds, total response time,
requests served, mean response time, requests per unit of cost, the shares of responses under
3 s, 3-9 s and 9-60 s, and the mean TTL. A run here adds the busiest server's utilization over
the mean, the server-seconds spent at 100 % utilization, failed requests and response-time
percentiles; and how pausing behaved (issue 17): the manager's pause flips, and the
server-seconds spent overloaded (:func:`overloaded_seconds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

HISTOGRAM_STEP = 0.01
"""Width of a response-time histogram bin, seconds (percentiles are this precise)."""

HISTOGRAM_SCALE = 100.0
"""Bins per second: a response of ``t`` seconds counts in bin ``int(t * HISTOGRAM_SCALE)``."""


@dataclass(frozen=True, slots=True)
class ResponseStats:
    """Response times of served requests: their sum, the paper's bands and a fine histogram."""

    count: int
    total: float
    under_3: int
    from_3_to_9: int
    from_9: int  # 9 s up to the client's timeout (60 s in the paper)
    histogram: tuple[int, ...]

    @classmethod
    def from_histogram(cls, histogram: list[int], total: float) -> ResponseStats:
        """The figures of ``histogram`` (bins of :data:`HISTOGRAM_STEP`) with the exact sum
        ``total``; bands split at bin edges (3 s and 9 s are edges)."""
        three = round(3.0 * HISTOGRAM_SCALE)
        nine = round(9.0 * HISTOGRAM_SCALE)
        return cls(
            count=sum(histogram),
            total=total,
            under_3=sum(histogram[:three]),
            from_3_to_9=sum(histogram[three:nine]),
            from_9=sum(histogram[nine:]),
            histogram=tuple(histogram),
        )

    @classmethod
    def from_times(cls, times: Iterable[float]) -> ResponseStats:
        """The figures of individual response times (seconds)."""
        histogram: list[int] = []
        total = 0.0
        for seconds in times:
            slot = int(seconds * HISTOGRAM_SCALE)
            if slot >= len(histogram):
                histogram.extend([0] * (slot + 1 - len(histogram)))
            histogram[slot] += 1
            total += seconds
        return cls.from_histogram(histogram, total)

    def percentile(self, fraction: float) -> float:
        """The response time below which ``fraction`` of the responses fall (bin's upper edge)."""
        if not self.count:
            return 0.0
        wanted = fraction * self.count
        seen = 0
        for slot, number in enumerate(self.histogram):
            seen += number
            if seen >= wanted:
                return (slot + 1) * HISTOGRAM_STEP
        return len(self.histogram) * HISTOGRAM_STEP


@dataclass(frozen=True, slots=True)
class Series:
    """What the plots show, one entry per manager tick."""

    times: tuple[float, ...]
    utilization: dict[str, tuple[tuple[float, float], ...]]  # server id -> (time, sample)
    serving: tuple[int, ...]  # servers in the answers (active, not paused)
    paused: tuple[int, ...]
    booting: tuple[int, ...]
    draining: tuple[int, ...]
    answer_ttl: tuple[float, ...]  # mean TTL of the answers resolvers received in the tick
    mean_response: tuple[float, ...]  # mean response of requests that started in the tick
    users: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One run's figures (the paper's columns first), simulated or measured."""

    name: str
    cost: float  # server-seconds from launch (or start) to termination (or the end)
    total_response: float  # seconds, summed over served requests
    requests: int  # served requests
    mean_response: float
    requests_per_cost: float
    under_3: float  # shares of served requests
    from_3_to_9: float
    from_9_to_60: float
    mean_ttl: float  # over the answers the resolvers received
    busiest_over_mean: float  # see :func:`busiest_over_mean`
    saturated_seconds: float  # server-seconds with every worker slot busy (or more waiting)
    failed: int  # requests never served (dropped after every retry, or on a crashed server)
    p50: float
    p99: float
    dns_queries: int  # answers the resolvers received (mean_ttl is over them)
    peak_servers: int
    # How pausing behaved; keyword-only, so that results written before them still read (as 0).
    pause_flips: int = field(default=0, kw_only=True)  # the manager's paused and resumed events
    overloaded_seconds: float = field(default=0.0, kw_only=True)  # see overloaded_seconds()

    @property
    def pause_flips_per_hour(self) -> float:
        """Pause flips per server-hour of the run's cost (issue 17's goal: at most 6 at 90 % of
        the pool's capacity)."""
        return self.pause_flips * 3600.0 / self.cost if self.cost > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def paper_columns(
    stats: ResponseStats, *, cost: float, ttl_total: float, answers: int
) -> dict[str, Any]:
    """The paper's columns from served requests' ``stats``, the ``cost`` in server-seconds and
    the TTLs of the ``answers`` resolvers received (summed in ``ttl_total``), as keyword
    arguments of :class:`CaseResult`. Shares are of served requests; with none served, or no
    answer, the ratios are 0."""
    requests = stats.count
    return {
        "cost": cost,
        "total_response": stats.total,
        "requests": requests,
        "mean_response": stats.total / requests if requests else 0.0,
        "requests_per_cost": requests / cost if cost else 0.0,
        "under_3": stats.under_3 / requests if requests else 0.0,
        "from_3_to_9": stats.from_3_to_9 / requests if requests else 0.0,
        "from_9_to_60": stats.from_9 / requests if requests else 0.0,
        "mean_ttl": ttl_total / answers if answers else 0.0,
        "dns_queries": answers,
        "p50": stats.percentile(0.5),
        "p99": stats.percentile(0.99),
    }


def busiest_over_mean(
    samples: dict[str, list[tuple[float, float]]], window: float, until: float
) -> float:
    """How much busier the busiest server is than the pool's mean, over the run.

    Utilization samples are averaged per server over windows of ``window`` seconds (which
    removes the second-to-second noise of a random load but keeps any lasting imbalance); in
    each window the busiest server's average is divided by the mean over the servers that
    served in it, and the ratios are averaged over the windows whose mean is at least 0.1 (an
    idle pool is not unbalanced, only noisy). 1.0 is a perfectly even pool.
    """
    windows = max(1, int(until // window) + 1)
    sums: dict[tuple[int, str], list[float]] = {}
    for server, points in samples.items():
        for time, value in points:
            key = (int(time // window), server)
            entry = sums.setdefault(key, [0.0, 0.0])
            entry[0] += value
            entry[1] += 1.0
    per_window: list[list[float]] = [[] for _ in range(windows)]
    for (slot, _), (total, count) in sums.items():
        if slot < windows:
            per_window[slot].append(total / count)
    ratios = []
    for values in per_window:
        if len(values) < 2:
            continue
        mean = sum(values) / len(values)
        if mean >= 0.1:
            ratios.append(max(values) / mean)
    return sum(ratios) / len(ratios) if ratios else 1.0


OVERLOAD = 1.5
"""The utilization :func:`overloaded_seconds` counts above: half again the worker slots, queued."""
OVERLOAD_GRACE = 10.0
"""Seconds above :data:`OVERLOAD` a server may spend before they count (issue 17: no server
above utilization 1.5 for more than 10 s)."""


def overloaded_seconds(
    samples: Mapping[str, Sequence[tuple[float, float]]], until: float, *, longest_gap: float = 5.0
) -> float:
    """Server-seconds spent above utilization :data:`OVERLOAD` beyond the first
    :data:`OVERLOAD_GRACE` seconds of each spell there: 0 when no server stays overloaded for
    longer than that.

    ``samples`` are each server's (time, utilization) in time order; each sample stands until the
    next one (at most ``longest_gap`` seconds: a server missing from the samples is not assumed
    to stay as it was) and the last until ``until``.
    """
    total = 0.0
    for points in samples.values():
        spell: float | None = None  # when the current spell above OVERLOAD began
        for index, (time, value) in enumerate(points):
            following = points[index + 1][0] if index + 1 < len(points) else until
            end = min(following, time + longest_gap)
            if not value > OVERLOAD:  # a NaN ends a spell too
                spell = None
                continue
            if spell is None:
                spell = time
            total += max(0.0, end - max(time, spell + OVERLOAD_GRACE))
            if end < following:  # a gap in the samples: the spell is not known to go on
                spell = None
    return total


COLUMNS = (
    ("case", "{}", "name"),
    ("cost", "{:.0f}", "cost"),
    ("total resp s", "{:.0f}", "total_response"),
    ("requests", "{}", "requests"),
    ("mean resp s", "{:.3f}", "mean_response"),
    ("req/cost", "{:.2f}", "requests_per_cost"),
    ("<3s %", "{:.1f}", "under_3"),
    ("3-9s %", "{:.2f}", "from_3_to_9"),
    ("9-60s %", "{:.2f}", "from_9_to_60"),
    ("mean TTL", "{:.1f}", "mean_ttl"),
    ("busiest/mean", "{:.2f}", "busiest_over_mean"),
    ("at 100% s", "{:.0f}", "saturated_seconds"),
    ("failed", "{}", "failed"),
    ("p99 s", "{:.2f}", "p99"),
)
_PERCENT = {"under_3", "from_3_to_9", "from_9_to_60"}


def table(rows: Sequence[CaseResult], *, title: str | None = None) -> str:
    """A plain-text table of runs, the paper's columns first."""
    header = [name for name, _, _ in COLUMNS]
    body = []
    for row in rows:
        cells = []
        for _, fmt, attr in COLUMNS:
            value = getattr(row, attr)
            if attr in _PERCENT:
                value = value * 100
            cells.append(fmt.format(value))
        body.append(cells)
    widths = [max(len(cells[i]) for cells in [header, *body]) for i in range(len(header))]
    lines = []
    if title:
        lines.append(title)
    lines.append(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    for cells in body:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
    return "\n".join(lines)


def markdown_table(rows: Sequence[CaseResult]) -> str:
    """The same table in Markdown (for docs/simulation.md)."""
    header = [name for name, _, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = []
        for _, fmt, attr in COLUMNS:
            value = getattr(row, attr)
            if attr in _PERCENT:
                value = value * 100
            cells.append(fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
