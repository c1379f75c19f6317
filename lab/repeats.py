"""Repeated runs of a case: means, 95 % confidence intervals (Student t), the paper's orderings.

Pure arithmetic on :class:`~evaluation.columns.CaseResult` rows (the columns and their formats
are :data:`evaluation.columns.COLUMNS`): :func:`interval` is a column's mean and the half-width
of its 95 % interval over the repeats, :func:`ci_table` shows every column as ``mean ±half``,
and :func:`orderings` says which of the paper's orderings between the headline cases hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evaluation.columns import COLUMNS, CaseResult

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student's t 0.975 quantile for 1 to 30 degrees of freedom (two-sided 95 %)."""


def t975(df: int) -> float:
    """Student's t 0.975 quantile with ``df`` degrees of freedom (above 30: its expansion
    around the normal's 1.95996, within 0.001 of the exact value)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over ``n`` repeats and the half-width of its 95 % interval (NaN for one run)."""

    mean: float
    half: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


def interval(values: Sequence[float]) -> Interval:
    """Mean and 95 % Student t half-width of ``values`` (sample standard deviation)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(mean, math.nan, 1)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return Interval(mean, t975(n - 1) * math.sqrt(variance / n), n)


NUMERIC = tuple(attr for _, _, attr in COLUMNS if attr != "name")
_PERCENT = {"under_3", "from_3_to_9", "from_9_to_60"}


def summarize(runs: Sequence[CaseResult]) -> dict[str, Interval]:
    """Every numeric column of :data:`COLUMNS` over ``runs`` (shares as percentages)."""
    scale = {attr: 100.0 if attr in _PERCENT else 1.0 for attr in NUMERIC}
    return {
        attr: interval([float(getattr(run, attr)) * scale[attr] for run in runs])
        for attr in NUMERIC
    }


def cell(value: Interval, fmt: str) -> str:
    """``mean ±half`` in ``fmt`` (the mean alone when there is no interval)."""
    fmt = fmt if "." in fmt else "{:.0f}" if fmt == "{}" else fmt
    if math.isnan(value.half):
        return fmt.format(value.mean)
    return f"{fmt.format(value.mean)} ±{fmt.format(value.half)}"


def ci_table(rows: Mapping[str, Sequence[CaseResult]]) -> str:
    """A plain-text table, a row per case (label -> its runs): every column ``mean ±half``
    (95 % interval over the runs; the mean alone for a single run), then ``n``."""
    header = [name for name, _, _ in COLUMNS] + ["n"]
    body = []
    for label, runs in rows.items():
        summary = summarize(runs)
        cells = [label]
        for _, fmt, attr in COLUMNS[1:]:
            cells.append(cell(summary[attr], fmt))
        cells.append(str(len(runs)))
        body.append(cells)
    widths = [max(len(cells[i]) for cells in [header, *body]) for i in range(len(header))]
    lines = []
    for cells in [header, *body]:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Ordering:
    """One of the paper's claims: case ``low``'s ``column`` below case ``high``'s (for columns
    where more is better, ``low`` is the case claimed to have less of it)."""

    column: str
    low: str
    high: str


MORE_IS_BETTER = {"requests_per_cost", "under_3"}
"""Columns whose claim reads "the product's is higher" (shown with >)."""

PAPER_ORDERINGS = (
    Ordering("mean_response", "t3-c", "t2-c"),
    Ordering("mean_response", "t2-c", "t1-a"),
    Ordering("mean_response", "t3-c", "t1-a"),
    Ordering("mean_response", "t3-c", "t4-fixed"),
    Ordering("from_3_to_9", "t3-c", "t1-a"),
    Ordering("from_9_to_60", "t3-c", "t1-a"),
    Ordering("busiest_over_mean", "t3-c", "t1-a"),
    Ordering("requests_per_cost", "t1-a", "t3-c"),
    Ordering("mean_ttl", "t3-c", "t1-a"),
)
"""The paper's orderings between the headline cases: the product (t3-c, k = 4) answers faster
than round-robin TTL 30 with pausing (t2-c), which answers faster than plain round-robin TTL 60
(t1-a); the product has fewer slow responses, a more even pool, more requests per cost and a
lower mean TTL than plain round-robin, and answers faster than a fixed 40 s TTL (t4-fixed)."""


def verdict(low: Interval, high: Interval) -> str:
    """``holds`` (the means in that order and the 95 % intervals apart), ``holds in the means
    (intervals overlap)``, or ``does not hold``."""
    if low.mean < high.mean:
        if not math.isnan(low.half) and not math.isnan(high.half) and low.high < high.low:
            return "holds"
        return "holds in the means (intervals overlap)"
    return "does not hold"


def orderings(
    summaries: Mapping[str, Mapping[str, Interval]], labels: Mapping[str, str] | None = None
) -> list[str]:
    """A line per paper ordering whose two cases were run (``summaries``: case key -> its
    :func:`summarize`), saying whether it holds."""
    names = {attr: name for name, _, attr in COLUMNS}
    labels = labels or {}
    lines = []
    for claim in PAPER_ORDERINGS:
        if claim.low not in summaries or claim.high not in summaries:
            continue
        low = summaries[claim.low][claim.column]
        high = summaries[claim.high][claim.column]
        first, second = labels.get(claim.low, claim.low), labels.get(claim.high, claim.high)
        claimed = (
            f"{second} {high.mean:.4g} > {first} {low.mean:.4g}"
            if claim.column in MORE_IS_BETTER
            else f"{first} {low.mean:.4g} < {second} {high.mean:.4g}"
        )
        lines.append(f"{names[claim.column]}: {claimed}: {verdict(low, high)}")
    return lines
