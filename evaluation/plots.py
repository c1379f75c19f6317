"""PNG plots of a run, simulated or measured: per-server utilization, pool size, answer TTL,
response time.

matplotlib is imported here only (with the non-interactive Agg backend), so that running
simulations does not need it loaded.
"""

from __future__ import annotations

from pathlib import Path

from evaluation.columns import Series
from evaluation.percentile import percentile

MAX_LINES = 24
"""Above this many servers, utilization is drawn as percentile bands instead of lines."""


def write_plots(series: Series, directory: Path, title: str) -> list[Path]:
    """Write ``utilization.png``, ``pool.png``, ``ttl.png`` and ``response.png`` into
    ``directory``; returns their paths."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    written = []

    figure, axes = plt.subplots(figsize=(10, 4.5))
    if len(series.utilization) <= MAX_LINES:
        for server, points in sorted(series.utilization.items()):
            axes.plot(
                [time for time, _ in points], [value for _, value in points], lw=0.6, label=server
            )
        if series.utilization:
            axes.legend(fontsize=6, ncol=2, loc="upper left")
    else:
        _bands(axes, series)
    axes.set(xlabel="time (s)", ylabel="utilization", title=f"{title}: utilization per server")
    axes.grid(alpha=0.3)
    written.append(_save(figure, directory / "utilization.png"))

    figure, axes = plt.subplots(figsize=(10, 3.5))
    times = series.times
    axes.stackplot(
        times,
        series.serving,
        series.paused,
        series.booting,
        series.draining,
        labels=["serving", "paused", "booting", "draining"],
        alpha=0.8,
    )
    axes.set(xlabel="time (s)", ylabel="servers", title=f"{title}: pool size")
    twin = axes.twinx()
    twin.plot(times, series.users, color="black", lw=0.8, label="users")
    twin.set_ylabel("users")
    axes.legend(loc="upper left", fontsize=7)
    written.append(_save(figure, directory / "pool.png"))

    figure, axes = plt.subplots(figsize=(10, 3.5))
    axes.plot(times, series.answer_ttl, ".", ms=2)
    axes.set(xlabel="time (s)", ylabel="TTL (s)", title=f"{title}: mean TTL of answers given")
    axes.grid(alpha=0.3)
    written.append(_save(figure, directory / "ttl.png"))

    figure, axes = plt.subplots(figsize=(10, 3.5))
    axes.plot(times, series.mean_response, lw=0.7)
    axes.set(
        xlabel="time (s)",
        ylabel="seconds",
        title=f"{title}: mean response of requests started each tick",
    )
    axes.grid(alpha=0.3)
    written.append(_save(figure, directory / "response.png"))
    plt.close("all")
    return written


def _bands(axes: object, series: Series) -> None:
    """Median, 90th percentile and maximum of the servers' utilization per tick."""
    by_time: dict[float, list[float]] = {}
    for points in series.utilization.values():
        for time, value in points:
            by_time.setdefault(time, []).append(value)
    times = sorted(by_time)
    rows = [by_time[time] for time in times]
    for fraction, label in ((0.5, "median"), (0.9, "p90"), (1.0, "busiest")):
        axes.plot(  # type: ignore[attr-defined]
            times, [percentile(row, fraction) for row in rows], lw=0.7, label=label
        )
    axes.plot(  # type: ignore[attr-defined]
        times, [sum(row) / len(row) for row in rows], lw=1.0, color="black", label="mean"
    )
    axes.legend(fontsize=7, loc="upper left")  # type: ignore[attr-defined]


def _save(figure: object, path: Path) -> Path:
    figure.tight_layout()  # type: ignore[attr-defined]
    figure.savefig(path, dpi=100)  # type: ignore[attr-defined]
    return path
